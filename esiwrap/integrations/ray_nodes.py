"""Every node of a Ray cluster watched for its own deadline, from the driver esiwrap started.

esiwrap on the head knows its own machine's deadline; the nodes that `ray start --address=…`
joined have their own (another reservation, a spot notice on one worker only). So the driver (the
relay of `ray_relay`) keeps a watch on every other live node: a zero-CPU actor pinned there (hard
node affinity) that asks that node's deadline sources the way esiwrap asks its own, a thread
each, each on its own period. The node's environment decides which: `ESIWRAP_SOURCES` (default
`env,volcengine,volcengine-spot`), the other `ESIWRAP_*` settings, `MLP_…`, and the node's own
metadata service; `ESIWRAP_DEADLINE` on a node is that node's `--deadline`.

Each answer goes to esiwrap as a `deadline` message named `node:<short id>/<source>`, with
`node_id` and `address` in its detail, and esiwrap plans with the earliest of all. The nodes are
listed every `SCAN_S`: a node that joins later is watched from then on; the answers of a node
that leaves are withdrawn (dropped from the minimum). A watch that cannot start, or dies while
its node lives, is reported as the node's unavailable answer (esiwrap logs it; training goes on)
and placed again after `RETRY_S`.

`esiwrap deadline --cluster` asks every node once, the same way (`ask_cluster`).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from esiwrap.core.values import Answer
from esiwrap.sources import remote
from esiwrap.sources.base import Source
from esiwrap.sources.chain import ask_all

__all__ = ["ClusterWatch", "NodeAnswers", "NodeWatch", "ask_cluster", "node_sources"]

SCAN_S = 5.0  # how often the driver lists the cluster's nodes
POLL_S = 10.0  # how long one call to a node's watch waits for news
RETRY_S = 30.0  # before placing a failed watch again
Fields = dict[str, Any]


@dataclass(frozen=True)
class Node:
    node_id: str
    address: str

    def name(self, source: str = "") -> str:
        return remote.node_source(self.node_id, source)

    def own(self, answer: Answer) -> Answer:
        """The answer of one of this node's sources, named after the node."""
        name = self.name(answer.source)
        if answer.deadline is None:
            return replace(answer, source=name)
        detail = {**answer.deadline.detail, "node_id": self.node_id, "address": self.address}
        return replace(answer, source=name, deadline=replace(answer.deadline, source=name, detail=detail))


def node_sources(environ: Mapping[str, str], now: float) -> list[Source]:
    """The deadline sources a node's environment names, as `esiwrap` reads its options there.
    Raises `UsageError` for a bad `ESIWRAP_*` value."""
    import argparse

    from esiwrap.optiontypes import resolve_options
    from esiwrap.sources.registry import SOURCE_OPTIONS, build_sources

    values = resolve_options(argparse.Namespace(), SOURCE_OPTIONS, environ)
    return build_sources(values["sources"], values, environ, now)


def _sources_or_why(node: Node, now: float) -> tuple[list[Source], list[Answer]]:
    try:
        sources = node_sources(os.environ, now)
    except Exception as exc:  # UsageError: a bad ESIWRAP_* on that node
        return [], [Answer(node.name(), reason=f"this node's esiwrap settings: {exc}")]
    if not sources:
        return [], [Answer(node.name(), reason="no deadline sources (ESIWRAP_SOURCES)", expected=True)]
    return sources, []


# ---------------------------------------------------------------------- on each node
class NodeWatch:
    """A Ray actor on one node: that node's sources, watched as esiwrap watches its own."""

    def __init__(self, node_id: str, address: str) -> None:
        from esiwrap.sources.watcher import DeadlineWatcher

        self._node = Node(node_id, address)
        sources, self._news = _sources_or_why(self._node, time.time())
        self._wake_r, wake_w = socket.socketpair()
        self._watcher = DeadlineWatcher(sources, wake_w)
        self._watcher.start()

    def answers(self, wait_s: float) -> list[Fields]:
        """What the sources said since the last call, waiting up to `wait_s` for something."""
        if not self._news:
            select.select([self._wake_r], [], [], wait_s)
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096, socket.MSG_DONTWAIT)
        found, self._news = [*self._news, *self._watcher.drain()], []
        return [remote.to_fields(self._node.own(answer)) for answer in found]


def _ask_node_once(node_id: str, address: str) -> list[Fields]:
    """A Ray task on one node: every source of the node asked once (`esiwrap deadline --cluster`)."""
    node, now = Node(node_id, address), time.time()
    sources, why = _sources_or_why(node, now)
    return [remote.to_fields(node.own(answer)) for answer in why or ask_all(sources, now)]


def _pinned(node_id: str) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


def _alive_nodes(ray: Any) -> dict[str, str]:
    """Node id -> address of the cluster's live nodes."""
    return {str(n["NodeID"]): str(n.get("NodeManagerAddress") or "") for n in ray.nodes() if n.get("Alive")}


# ---------------------------------------------------------------------- in the driver
@dataclass
class _Watched:
    node: Node
    actor: Any = None
    call: Any = None  # the pending `answers` call (an ObjectRef)
    sources: set[str] = field(default_factory=set)  # names it answered with: withdrawn when it leaves
    retry_at: float = 0.0  # monotonic


class ClusterWatch:
    """In the driver: a `NodeWatch` on every other live node; their answers go to `send`."""

    def __init__(self, send: Callable[[Fields], object]) -> None:
        self._send = send
        self._watched: dict[str, _Watched] = {}
        self._actor_class: Any = None
        self._last_error = ""

    def start(self) -> None:
        threading.Thread(target=self._run, name="esiwrap-nodes", daemon=True).start()

    def _run(self) -> None:
        import ray

        own = ray.get_runtime_context().get_node_id()  # esiwrap watches this node itself
        self._actor_class = ray.remote(NodeWatch)
        next_scan = 0.0
        while ray.is_initialized():
            try:
                if time.monotonic() >= next_scan:
                    self._scan(ray, own)
                    next_scan = time.monotonic() + SCAN_S
                self._collect(ray, max(0.0, next_scan - time.monotonic()))
            except Exception as exc:
                if not ray.is_initialized():
                    return  # the driver is shutting Ray down
                self._complain(exc)
                time.sleep(SCAN_S)

    def _complain(self, exc: Exception) -> None:
        if repr(exc) != self._last_error:  # once per kind of trouble
            self._last_error = repr(exc)
            print(f"esiwrap: watching the cluster's nodes: {exc!r}", file=sys.stderr)

    def _scan(self, ray: Any, own: str) -> None:
        alive = _alive_nodes(ray)
        for node_id in [n for n in self._watched if n not in alive]:
            self._withdraw(ray, self._watched.pop(node_id), "the node left the cluster")
        now = time.monotonic()
        for node_id, address in alive.items():
            if node_id == own:
                continue
            watched = self._watched.setdefault(node_id, _Watched(Node(node_id, address)))
            if watched.actor is None and now >= watched.retry_at:
                watched.actor = self._actor_class.options(**_pinned(node_id)).remote(node_id, address)
                watched.call = watched.actor.answers.remote(POLL_S)

    def _collect(self, ray: Any, timeout_s: float) -> None:
        calls = {w.call: w for w in self._watched.values() if w.call is not None}
        if not calls:
            time.sleep(timeout_s)
            return
        ready, _ = ray.wait(list(calls), num_returns=1, timeout=timeout_s)
        for ref in ready:
            self._take(ray, calls[ref], ref)

    def _take(self, ray: Any, watched: _Watched, ref: Any) -> None:
        try:
            answers: list[Fields] = ray.get(ref)
        except Exception as exc:
            self._failed(ray, watched, exc)
            return
        for fields in answers:
            watched.sources.add(str(fields.get("source")))
            self._send(fields)
        watched.call = watched.actor.answers.remote(POLL_S)

    def _failed(self, ray: Any, watched: _Watched, exc: Exception) -> None:
        node = watched.node
        if node.node_id not in _alive_nodes(ray):
            self._watched.pop(node.node_id, None)
            self._withdraw(ray, watched, "the node left the cluster")
            return
        watched.actor = watched.call = None
        watched.retry_at = time.monotonic() + RETRY_S
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        reason = f"no watch on this node ({type(exc).__name__}: {first_line}); retrying in {RETRY_S:g}s"
        watched.sources.add(node.name())
        self._send(remote.to_fields(Answer(node.name(), reason=reason)))

    def _withdraw(self, ray: Any, watched: _Watched, reason: str) -> None:
        for source in sorted(watched.sources | {watched.node.name()}):
            self._send(remote.to_fields(Answer(source, reason=reason, withdrawn=True)))
        if watched.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(watched.actor)


# ---------------------------------------------------------------------- esiwrap deadline --cluster
@dataclass
class NodeAnswers:
    node: Node
    answers: list[Answer]
    error: str = ""  # the node could not be asked


def ask_cluster(address: str, timeout_s: float) -> list[NodeAnswers]:
    """Connect to the cluster at `address` ("auto": the one on this machine), ask every live node
    once, and disconnect. Raises `ConnectionError` when no cluster answers."""
    import logging

    import ray

    from esiwrap.paths import package_dir

    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, namespace="esiwrap",
             runtime_env={"py_modules": [package_dir()]})
    try:
        ask = ray.remote(_ask_node_once)
        alive = _alive_nodes(ray)
        calls = {node_id: ask.options(max_retries=0, **_pinned(node_id)).remote(node_id, node_address)
                 for node_id, node_address in alive.items()}
        ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout_s)
        return [_node_answers(ray, Node(node_id, alive[node_id]), ref) for node_id, ref in calls.items()]
    finally:
        ray.shutdown()


def _node_answers(ray: Any, node: Node, ref: Any) -> NodeAnswers:
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        ray.cancel(ref, force=True)
        return NodeAnswers(node, [], error="no answer in time")
    try:
        fields = ray.get(ref)
    except Exception as exc:
        return NodeAnswers(node, [], error=f"{type(exc).__name__}: {str(exc)[:200]}")
    now = time.time()
    answers = [answer for answer in (remote.from_fields(f, now) for f in fields) if answer is not None]
    return NodeAnswers(node, answers)
