"""A plain Ray driver (verl or not) under esiwrap, on a cluster of two raylets: the README's five
lines work whichever comes first, `esiwrap.trainer.install()` or `ray.init` (whose start-up hook
installs a save-signal handler of its own and asks to be stopped with SIGINT). Real Ray, real
signals, a checkpoint on disk."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from esiwrap_harness import CHILDREN, PYTHON, EsiwrapRun, free_port, wait_until
from ray_cluster import RayNode, leftovers, node_environment, node_with, ray_env

from esiwrap.errors import EXIT_CHECKPOINTED

DRIVER = CHILDREN / "ray_plain_driver.py"
pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Path, str]]:
    """A head and a second node, each its own raylet (`ray start`), on this machine."""
    tmp = Path(tempfile.mkdtemp(prefix="esd-", dir="/tmp"))  # Ray's socket paths stay short
    nodes: list[RayNode] = []
    try:
        port = free_port()
        address = f"127.0.0.1:{port}"
        nodes.append(RayNode.head(tmp, node_environment(tmp), port))
        node_with("head", address, node_environment(tmp))
        nodes.append(RayNode.worker(tmp, node_environment(tmp), address, "node_b"))
        node_with("node_b", address, node_environment(tmp))
        yield tmp, address
    finally:
        for node in reversed(nodes):
            node.stop()
        assert wait_until(lambda: not leftovers(tmp), timeout=30), [p.info["cmdline"] for p in leftovers(tmp)]
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("order", ["before", "after"])
def test_a_plain_ray_driver_saves_and_is_stopped_with_sigint(esiwrap, cluster: tuple[Path, str],
                                                              tmp_path: Path, order: str) -> None:
    """`install()` before or after `ray.init(address=…)`: the deadline's save signal sets the
    flag `save_requested()` reads (the hook's handler chains install()'s, or install()'s chains the
    hook's), the save is acknowledged and esiwrap stops the driver with the SIGINT it asked for
    (neither hello undoes the other): exit 75, the checkpoint on disk. It used to miss the save
    (install() first: exit 76) or stop the driver with SIGTERM (install() after)."""
    tmp, address = cluster
    checkpoint = tmp_path / "ckpt.json"
    run: EsiwrapRun = esiwrap(
        "--deadline", "+40s", "--redundant-time", "8", "--save-duration", "1", "--no-final-save",
        "--stop-grace", "20", "--", PYTHON, str(DRIVER), order, str(checkpoint),
        env=ray_env(tmp, RAY_ADDRESS=address), cwd=str(tmp_path),
    )
    run.wait_stdout("driver ready", 180)
    code = run.finish(180)
    assert code == EXIT_CHECKPOINTED, (run.names(), run.other_lines[-20:], run.stdout[-500:])
    saved = run.first("save_completed")
    assert saved["requested"] is True and json.loads(checkpoint.read_text())["step"] == saved["step"]
    assert run.first("child_stopping")["signal"] == "SIGINT"
    assert b"interrupted: shutting Ray down" in run.stdout
    attached = [e for e in run.events if e["event"] == "trainer_attached"]
    assert {e.get("role") for e in attached} == {None, "ray-driver"}  # install() and the hook
