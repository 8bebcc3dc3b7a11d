"""A Ray cluster of several nodes on this machine, each with its own deadline: esiwrap on the head
plans with the earliest deadline of any live node (real Ray, real verl, real processes).

One cluster serves the module: a head and a worker node B, started by `ray start` with their own
environments. B's deadline sources are its own loopback fakes: a metadata service (instance,
region, spot notice) and the ECS OpenAPI (its release time), which each test sets. Nodes that
join (C) or join and leave (D) mid-run are started by their test. The head's own deadline is an
`MLP_…` variable far away (900 s), so every save here comes from another node's deadline.

The verl runs are `esiwrap -- python tests/lib/verl_driver.py` (its TaskRunner runs verl's real
trainer code and `_save_checkpoint`); the driver joins the cluster through `RAY_ADDRESS`.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from esiwrap_harness import PYTHON, ROOT, EsiwrapRun, free_port, wait_until
from fakes.fixtures import CREDENTIALS, INSTANCE_ID, REGION, SCHEDULED_ID, rfc3339_in
from fakes.metadata import FakeMetadata
from fakes.volcengine_api import FakeVolcengineApi
from ray_cluster import RayNode, leftovers, node_environment, node_with, ray_env

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_USAGE
from esiwrap.times import parse_iso

DRIVER = ROOT / "tests" / "lib" / "verl_driver.py"
SPOT_ITEM = "/latest/spot_instance_termination_time"
MLP = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
RAY_TIMEOUT_S = 240.0  # importing verl in a fresh Ray worker is slow on a busy CI machine
PLAIN_DRIVER = "import ray, threading; ray.init(); threading.Event().wait()"
# The head declares a node dead after 3 missed health checks 1 s apart (Ray's default: ~30 s).
QUICK_HEALTH_CHECK = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                      "RAY_health_check_failure_threshold": "3"}
pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]


@dataclass
class Cluster:
    tmp: Path
    address: str
    head_id: str
    b_id: str  # worker node B, whose sources are the fakes below
    b_metadata: FakeMetadata
    b_api: FakeVolcengineApi

    def driver_env(self, **extra: str) -> dict[str, str]:
        """esiwrap on the head: joins the cluster; its own deadline is 900 s away."""
        return ray_env(self.tmp, RAY_ADDRESS=self.address, **{MLP: str(int(time.time()) + 900)}, **extra)

    def join(self, resource: str, **node_env: str) -> tuple[RayNode, str]:
        """Start another node with its own environment; its node id once it is live."""
        node = RayNode.worker(self.tmp, node_environment(self.tmp, **node_env), self.address, resource)
        return node, node_with(resource, self.address, node_environment(self.tmp))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    tmp = Path(tempfile.mkdtemp(prefix="esn-", dir="/tmp"))  # Ray's socket paths stay short
    nodes: list[RayNode] = []
    try:
        with FakeMetadata({"/latest/instance_id": INSTANCE_ID, "/latest/region_id": REGION}) as metadata, \
                FakeVolcengineApi() as api:
            api.add_instance(INSTANCE_ID, SCHEDULED_ID, expired_at=rfc3339_in(86400))
            api.set_release(SCHEDULED_ID, rfc3339_in(3600))
            port = free_port()
            address = f"127.0.0.1:{port}"
            nodes.append(RayNode.head(tmp, node_environment(tmp, **QUICK_HEALTH_CHECK), port))
            head_id = node_with("head", address, node_environment(tmp))
            b_env = node_environment(tmp, **CREDENTIALS, ESIWRAP_METADATA_URL=metadata.url,
                                     ESIWRAP_VOLCENGINE_ENDPOINT=api.url,
                                     ESIWRAP_SOURCES="env,volcengine,volcengine-spot")
            nodes.append(RayNode.worker(tmp, b_env, address, "node_b"))
            b_id = node_with("node_b", address, node_environment(tmp))
            yield Cluster(tmp, address, head_id, b_id, metadata, api)
    finally:
        for node in reversed(nodes):
            node.stop()
        assert wait_until(lambda: not leftovers(tmp), timeout=30), [p.info["cmdline"] for p in leftovers(tmp)]
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def b_far(cluster: Cluster) -> Cluster:
    """Node B as each test starts: released in an hour, no spot notice."""
    cluster.b_api.set_release(SCHEDULED_ID, rfc3339_in(3600))
    cluster.b_metadata.set(SPOT_ITEM, None)
    return cluster


def verl_run(esiwrap: Any, cluster: Cluster, work: Path, loop: str, redundant_s: str) -> EsiwrapRun:
    run: EsiwrapRun = esiwrap(
        "--redundant-time", redundant_s, "--save-duration", "2", "--no-final-save",
        "--log-level", "debug", "--log-file", str(work / "esiwrap.jsonl"), "--",
        PYTHON, str(DRIVER), "--loop", loop, "--ckpt-dir", str(work / "ckpt"),
        "--pid-file", str(work / "taskrunner.pid"), "--step-seconds", "0.5", "--save-freq", "-1",
        env=cluster.driver_env(), cwd=str(work),
    )
    return run


def node_prefix(node_id: str) -> str:
    return f"node:{node_id[:8]}/"


def saved_before(run: EsiwrapRun, work: Path, source: str, loop: str) -> dict[str, Any]:
    """Exit 75 after one save, asked for by the deadline of `source` and complete before it."""
    code = run.finish(timeout=RAY_TIMEOUT_S)
    assert code == EXIT_CHECKPOINTED, (run.names(), run.other_lines[-30:])
    ruling = [e for e in run.events if e["event"] in ("deadline_resolved", "deadline_changed")]
    assert ruling[-1]["source"] == source, ruling
    deadline = parse_iso(ruling[-1].get("new") or ruling[-1]["deadline"])
    requested = run.first("save_requested")
    assert requested["reason"] == "deadline" and requested["kind"] == "insurance"
    completed = [e for e in run.events if e["event"] == "save_completed"]
    assert len(completed) == 1 and completed[0]["requested"] is True
    assert parse_iso(completed[0]["timestamp"]) < deadline and completed[0]["remaining_s"] > 0
    step = completed[0]["step"]
    assert (work / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == str(step)
    assert (work / "ckpt" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").exists()
    loop_hello = next(e for e in run.events if e["event"] == "trainer_attached" and e.get("loop"))
    assert loop_hello["loop"] == loop
    return ruling[-1]


def job_gone(cluster: Cluster, work: Path) -> None:
    """Nothing of the job is left on any node: driver, TaskRunner, the nodes' watches."""
    taskrunner = int((work / "taskrunner.pid").read_text())
    assert wait_until(lambda: not psutil.pid_exists(taskrunner), timeout=60), "TaskRunner left behind"
    assert wait_until(lambda: not node_watches(cluster), timeout=60), node_watches(cluster)


def node_watches(cluster: Cluster) -> list[int]:
    """PIDs of live `NodeWatch` actors of this cluster (Ray titles a worker by its actor)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            home = (proc.info["environ"] or {}).get("HOME", "")
        except psutil.Error:
            continue
        if "NodeWatch" in cmdline and home.startswith(str(cluster.tmp)):
            found.append(proc.pid)
    return found


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="esw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_worker_nodes_earlier_release_rules_and_the_save_comes_before_it(
    esiwrap: Any, b_far: Cluster, work: Path
) -> None:
    """Node B is released in 150 s (its own ECS OpenAPI), the head in 900 s: esiwrap on the head
    learns B's deadline from the watch the driver placed on B (source `node:<B>/volcengine`,
    node id and address in the log), plans the insurance save against it, and the TaskRunner
    saves through verl's `_save_checkpoint` (legacy loop) before it; exit 75, the job is gone
    from both nodes while the cluster lives on."""
    b_far.b_api.set_release(SCHEDULED_ID, rfc3339_in(150))
    run = verl_run(esiwrap, b_far, work, "legacy", redundant_s="125")
    ruling = saved_before(run, work, node_prefix(b_far.b_id) + "volcengine", "legacy")
    assert (ruling["node_id"], ruling["scheduled_instance_id"]) == (b_far.b_id, SCHEDULED_ID)
    assert ruling["address"]
    own = run.first("deadline_resolved")
    assert own["source"] == "env:MLP" or own["source"].startswith(node_prefix(b_far.b_id))
    assert not any(e.get("source", "").startswith(node_prefix(b_far.head_id)) for e in run.events)
    job_gone(b_far, work)


def test_a_spot_notice_on_the_worker_only_mid_run_is_the_deadline(
    esiwrap: Any, b_far: Cluster, work: Path
) -> None:
    """Training (V1 loop) runs against the head's 900 s; then a spot notice appears in node B's
    metadata only, 75 s ahead: the head's esiwrap hears of it within seconds (`deadline_changed`
    from `node:<B>/volcengine-spot`), and the save lands before it; exit 75."""
    run = verl_run(esiwrap, b_far, work, "v1", redundant_s="60")
    run.wait_for(lambda e: e["event"] == "step_observed" and e["step"] >= 2, RAY_TIMEOUT_S, "step 2")
    notice = rfc3339_in(75)
    b_far.b_metadata.set(SPOT_ITEM, notice)
    spot = node_prefix(b_far.b_id) + "volcengine-spot"
    changed = run.wait_event("deadline_changed", timeout=60, source=spot)
    assert changed["raw"] == notice and changed["node_id"] == b_far.b_id
    saved_before(run, work, spot, "v1")
    job_gone(b_far, work)


def test_a_node_that_joins_mid_run_with_the_earliest_deadline_is_watched(
    esiwrap: Any, b_far: Cluster, work: Path
) -> None:
    """Node C joins the cluster while the job trains, its own `MLP_…` 100 s ahead: within a scan
    the driver places a watch on it, its deadline rules, and the job saves before it; exit 75."""
    run = verl_run(esiwrap, b_far, work, "legacy", redundant_s="80")
    run.wait_for(lambda e: e["event"] == "trainer_attached" and e.get("loop"), RAY_TIMEOUT_S, "the loop")
    node, c_id = b_far.join("node_c", ESIWRAP_SOURCES="env", **{MLP: str(int(time.time()) + 100)})
    try:
        ruling = saved_before(run, work, node_prefix(c_id) + "env:MLP", "legacy")
        assert ruling["event"] == "deadline_changed" and ruling["node_id"] == c_id
        job_gone(b_far, work)
    finally:
        node.stop()


def test_a_node_that_leaves_is_dropped_from_the_minimum(esiwrap: Any, b_far: Cluster) -> None:
    """Any Ray driver under esiwrap watches the nodes (here one that only connects). Node D joins
    with the earliest deadline and rules; when it leaves, its answers are withdrawn and the
    deadline goes back to the head's own. Training is never touched."""
    run = esiwrap("--sources", "env", "--", PYTHON, "-c", PLAIN_DRIVER, env=b_far.driver_env())
    run.wait_event("trainer_attached", timeout=RAY_TIMEOUT_S)
    own = run.wait_event("deadline_resolved", timeout=30)
    node, d_id = b_far.join("node_d", ESIWRAP_SOURCES="env", **{MLP: str(int(time.time()) + 600)})
    try:
        source = node_prefix(d_id) + "env:MLP"
        joined = run.wait_event("deadline_changed", timeout=60, source=source)
        assert joined["new"] < own["deadline"]
    finally:
        node.stop()
    withdrawn = run.wait_event("deadline_withdrawn", timeout=60, source=source)
    assert withdrawn["reason"] == "the node left the cluster"
    back = run.wait_event("deadline_changed", timeout=30, source="env:MLP")
    assert back["new"] == own["deadline"]
    assert not any(e["event"] in ("save_requested", "child_stopping") for e in run.events)
    run.signal(signal.SIGINT)  # forwarded to the driver, which ends
    assert run.finish(timeout=60) != EXIT_CHECKPOINTED


def esiwrap_deadline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "esiwrap", "deadline", *args], env=env, capture_output=True,
                          text=True, timeout=180, check=False)


def test_deadline_cluster_prints_one_line_per_node(b_far: Cluster) -> None:
    """`esiwrap deadline --cluster`: every node asked with its own sources, one line each (id,
    address, deadline and source, or why none), then the cluster's; `--json` the same for
    machines. Only B knows a deadline here."""
    release = rfc3339_in(1800)
    b_far.b_api.set_release(SCHEDULED_ID, release)
    env = node_environment(b_far.tmp, RAY_ADDRESS=b_far.address)
    text = esiwrap_deadline("--cluster", env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 3, lines
    b_line = next(line for line in lines if line.startswith(f"node {b_far.b_id[:8]}"))
    assert "from volcengine" in b_line and parse_iso(release) == pytest.approx(
        parse_iso(b_line.split()[3]), abs=1)
    head_line = next(line for line in lines if line.startswith(f"node {b_far.head_id[:8]}"))
    assert " none: " in head_line and f"{MLP} is not set" in head_line
    assert lines[-1].startswith("cluster deadline: ") and node_prefix(b_far.b_id) + "volcengine" in lines[-1]

    machine = esiwrap_deadline("--cluster", "--json", env=env)
    report = json.loads(machine.stdout)
    nodes = {n["node_id"]: n for n in report["nodes"]}
    assert set(nodes) == {b_far.head_id, b_far.b_id}
    assert nodes[b_far.b_id]["source"] == node_prefix(b_far.b_id) + "volcengine"
    assert nodes[b_far.head_id]["deadline"] is None and nodes[b_far.head_id]["reason"]
    assert report["source"] == node_prefix(b_far.b_id) + "volcengine"


def test_deadline_cluster_without_a_cluster_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """No Ray cluster at the address: one line naming it and the fix, exit 2 (at once: the port
    is asked before Ray, which would retry for minutes)."""
    env = node_environment(tmp_path)
    done = esiwrap_deadline("--cluster", "--address", f"127.0.0.1:{free_port()}", env=env)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no Ray cluster answers there" in done.stderr
