"""Ray clusters for tests: one `ray start --block` per node on this machine, each node with its
own environment (what that node's deadline sources read), each stopped by its own PID.

Ray's files go to a short directory per cluster (its Unix socket paths must stay under 108
bytes), which every Ray process names on its command line: `leftovers(tmp)` finds what survived.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import psutil
from esiwrap_harness import PYTHON, processes_with_marker, wait_until

RAY_BIN = str(Path(sys.executable).parent / "ray")
NODES_PROBE = (
    "import json, logging, ray\n"
    "ray.init(log_to_driver=False, logging_level=logging.ERROR)\n"
    "print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}))\n"
)


def ray_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Ray writes to /tmp/ray and ~/.ray: both go to the test's directory."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    (tmp / "ray").mkdir(exist_ok=True)
    return {
        "HOME": str(home), "RAY_TMPDIR": str(tmp / "ray"), "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": "", **extra,
    }


def node_environment(tmp: Path, **extra: str) -> dict[str, str]:
    """A node's whole environment: this process's, minus esiwrap's socket, plus `extra`."""
    env = {**os.environ, **ray_env(tmp), **extra}
    env.pop("ESIWRAP_SOCKET", None)
    return env


class RayNode:
    """`ray start --block`: the node's processes live as long as this one, which stops them on
    SIGTERM."""

    def __init__(self, tmp: Path, env: Mapping[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [RAY_BIN, "start", "--block", "--disable-usage-stats", f"--temp-dir={tmp / 'ray'}", *args],
            env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    @classmethod
    def head(cls, tmp: Path, env: Mapping[str, str], port: int, resource: str = "head") -> RayNode:
        return cls(tmp, env, "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                   "--include-dashboard=false", f"--resources={json.dumps({resource: 1})}")

    @classmethod
    def worker(cls, tmp: Path, env: Mapping[str, str], address: str, resource: str) -> RayNode:
        """A node joining the cluster at `address`, known by a custom resource of its own."""
        return cls(tmp, env, f"--address={address}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                   f"--resources={json.dumps({resource: 1})}")

    def stop(self) -> None:
        """SIGTERM to every process of the node (`ray start --block` alone takes ~20 s to take
        its raylet down), SIGKILL to what is left after 10 s: the node is gone, as when its
        instance is reclaimed."""
        tree = [p for p in map(_process, [self.proc.pid, *_descendants(self.proc.pid)]) if p is not None]
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=10)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def cluster_up(address: str, env: Mapping[str, str]) -> bool:
    """Whether `ray status` answers. A probe that does not answer within 60 s (a busy node: a
    full-suite run beside busy loops saw one hang) is a no, and the caller's wait asks again."""
    try:
        probe = subprocess.run([RAY_BIN, "status", f"--address={address}"], env=dict(env),
                               capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def live_nodes(address: str, env: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Node id -> resources of the cluster's live nodes (a short-lived Ray driver asks)."""
    done = subprocess.run([PYTHON, "-c", NODES_PROBE], env={**env, "RAY_ADDRESS": address},
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        return {}
    found: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def node_with(resource: str, address: str, env: Mapping[str, str], timeout: float = 120.0) -> str:
    """The id of the live node that has `resource`, once it has joined."""
    found: list[str] = []

    def joined() -> bool:
        found[:] = [n for n, resources in live_nodes(address, env).items() if resource in resources]
        return bool(found)

    assert wait_until(joined, timeout, interval=1.0), f"no node with {resource} joined {address}"
    return found[0]


def leftovers(tmp: Path) -> list[psutil.Process]:
    return processes_with_marker(str(tmp))


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
