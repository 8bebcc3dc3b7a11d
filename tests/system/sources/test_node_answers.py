"""What esiwrap does with other nodes' deadlines and with saves other nodes asked for, driven by a
child that sends the channel messages a Ray driver's node watch or a multi-node trainer sends
(real esiwrap, real datagrams; the real senders are tested in test_ray_nodes.py and
test_multinode_torchrun.py)."""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path
from typing import Any

from esiwrap_harness import PYTHON

from esiwrap.core.values import Answer, Deadline
from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.sources import remote
from esiwrap.times import iso_utc

SENDER = (
    "import json, os, signal, socket, sys\n"
    "sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "for text in sys.argv[1:]:\n"
    "    message = {'pid': os.getpid(), **json.loads(text)}\n"
    "    sock.sendto(json.dumps(message).encode(), os.environ['ESIWRAP_SOCKET'])\n"
    "signal.pause()\n"
)
NODE = "1a2b3c4d5e6f" + "0" * 44


def node_answer(source: str, at: float | None, **fields: Any) -> str:
    message: dict[str, Any] = {"type": "deadline", "source": source, "reason": "", "expected": False,
                               "withdrawn": False, **fields}
    if at is not None:
        message.update(at=at, raw=str(int(at)), lead_s=0.0,
                       detail={"node_id": NODE, "address": "10.0.0.6"})
    return json.dumps(message)


def test_answers_travel_as_plain_fields_and_only_a_nodes_are_taken() -> None:
    """An answer survives the trip through its fields; fields that do not name a node (a remote
    answer must never pose as `--deadline`), or whose time is not a plausible epoch, are
    dropped."""
    deadline = Deadline(at=1_900_000_000.5, source="node:1a2b3c4d/volcengine", raw="x",
                        detail={"node_id": NODE, "address": "10.0.0.6"})
    answers = [
        Answer("node:1a2b3c4d/volcengine", deadline=deadline),
        Answer("node:1a2b3c4d/env:MLP", reason="not set", expected=True),
        Answer("node:1a2b3c4d/env:MLP", reason="the node left the cluster", withdrawn=True),
        Answer("node:1a2b3c4d/aws-spot", reason="no spot interruption notice", expected=True,
               capacity="spot", early_warning="EC2 rebalance recommendation (noticeTime …)"),
    ]
    for answer in answers:
        assert remote.from_fields(json.loads(json.dumps(remote.to_fields(answer))), time.time()) == answer
    assert remote.node_source(NODE, "env:MLP") == "node:1a2b3c4d/env:MLP"
    good = remote.to_fields(answers[0])
    for bad in ({"source": "cli"}, {"source": "env:MLP"}, {"at": math.nan}, {"at": 5.0}, {"at": True},
                {"at": "1900000000"}, {"source": 7}):
        assert remote.from_fields({**good, **bad}, time.time()) is None, bad


def test_a_node_rules_while_it_is_there_and_is_dropped_when_it_leaves(esiwrap) -> None:
    """The node's earlier deadline rules (logged with its source, node id and address); its
    withdrawal drops it and the deadline goes back to esiwrap's own; an answer that poses as
    `cli` changes nothing."""
    own = time.time() + 3600
    node = time.time() + 1800
    messages = [
        node_answer("node:1a2b3c4d/env:MLP", node),
        node_answer("node:1a2b3c4d/env:MLP", None, reason="the node left the cluster", withdrawn=True),
        node_answer("cli", time.time() + 60),
    ]
    run = esiwrap("--sources", "env", "--on-sigterm", "forward", "--", PYTHON, "-c", SENDER, *messages,
                  env={"MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": str(int(own))})
    resolved = run.wait_event("deadline_resolved", source="env:MLP")
    changed = run.wait_event("deadline_changed", source="node:1a2b3c4d/env:MLP")
    assert (changed["new"], changed["node_id"], changed["address"]) == (iso_utc(node), NODE, "10.0.0.6")
    withdrawn = run.wait_event("deadline_withdrawn", source="node:1a2b3c4d/env:MLP")
    assert withdrawn["reason"] == "the node left the cluster"
    back = run.wait_event("deadline_changed", source="env:MLP")
    assert back["new"] == resolved["deadline"]
    run.signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    assert [e["event"] for e in run.events].count("deadline_changed") == 2  # not the one posing as cli


def test_a_save_another_node_asked_for_ends_this_nodes_run_too(esiwrap, tmp_path: Path) -> None:
    """No request of its own, no deadline: a save whose messages say `peer: true` is logged as a
    request (`reason: peer`), acknowledged like one, and esiwrap stops after it: exit 75 (its
    checkpoint is there, and passes its checks)."""
    checkpoint = tmp_path / "7"
    checkpoint.write_bytes(b"step 7")
    messages = [
        json.dumps({"type": "hello", "rank": 0, "world_size": 2, "saves": True}),
        json.dumps({"type": "save_begin", "step": 7, "peer": True}),
        json.dumps({"type": "save_end", "step": 7, "ok": True, "path": str(checkpoint), "duration_s": 0.5,
                    "peer": True}),
    ]
    run = esiwrap("--sources", "env", "--", PYTHON, "-c", SENDER, *messages)
    assert run.finish() == EXIT_CHECKPOINTED, run.names()
    requested = run.first("save_requested")
    assert (requested["reason"], requested["kind"], requested["remaining_s"]) == ("peer", "peer", None)
    completed = run.first("save_completed")
    assert (completed["step"], completed["requested"], completed["path"]) == (7, True, str(checkpoint))
    assert run.first("child_stopping")["reason"] == "checkpoint complete after a peer node's request"
