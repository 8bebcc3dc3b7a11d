"""The prior against real saves on this machine: a checkpoint of a few GB (model + Adam state).

    python benchmarks/prior.py                       # ~3 GB state, 3 rounds, in a temp dir on /work
    python benchmarks/prior.py --params 500e6 --rounds 2 --dir /mnt/nvme/tmp --json prior.json

For each round: esiwrap's storage probe of the directory (`esiwrap.shell.storage_probe.probe_bandwidth`: what
it wrote, how long it took), the checkpoint's size as `esiwrap.trainer.checkpoint_bytes` counts
it, the prior (size / probed bandwidth), and the real saves: `torch.save` alone (what most
trainers do: the data may still be in the page cache), `torch.save` + fsync (durable), and
`torch.distributed.checkpoint.save` + fsync of every file (DCP, the sharded format). The ratio
real / prior is the prior's error; `--json` keeps every figure. The previous-checkpoint
measurement (`esiwrap.shell.storage_probe.measure_checkpoint`, from the files' modification times) is checked
against the DCP save's real duration too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from esiwrap.shell.storage_probe import measure_checkpoint, probe_bandwidth
from esiwrap.trainer import checkpoint_bytes


def build_state(params: float) -> tuple[Any, Any]:
    """A model of about `params` fp32 parameters and an Adam optimizer with its state (one step)."""
    import torch

    width = 4096
    layers = max(1, round(params / (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # Adam's exp_avg and exp_avg_sq exist from here on
    return model, optimizer


def fsync_tree(path: str) -> None:
    """fsync `path`, or every file under it."""
    files = [path] if not os.path.isdir(path) else [
        os.path.join(root, name) for root, _dirs, names in os.walk(path) for name in names]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def timed(action: Callable[[], None]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def one_round(model: Any, optimizer: Any, directory: str) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp

    probe = probe_bandwidth(directory)
    nbytes = checkpoint_bytes(model, optimizer)
    prior = nbytes / probe.bandwidth_bps if probe.bandwidth_bps else math.nan
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    plain = os.path.join(directory, "plain.pt")
    saved_s = timed(lambda: torch.save(state, plain))
    durable_s = saved_s + timed(lambda: fsync_tree(plain))
    on_disk = os.path.getsize(plain)
    os.unlink(plain)
    again = os.path.join(directory, "durable.pt")

    def save_and_sync() -> None:
        torch.save(state, again)
        fsync_tree(again)

    cold_durable_s = timed(save_and_sync)
    os.unlink(again)
    dcp_dir = os.path.join(directory, "dcp")

    def dcp_save() -> None:
        dcp.save(state, checkpoint_id=dcp_dir, no_dist=True)
        fsync_tree(dcp_dir)

    dcp_s = timed(dcp_save)
    previous = measure_checkpoint(dcp_dir)
    shutil.rmtree(dcp_dir)
    return {
        "probe_bandwidth_mb_s": probe.bandwidth_bps / 1e6 if probe.bandwidth_bps else None,
        "probe_written_mb": probe.written_bytes / 1e6, "probe_s": probe.seconds, "probe_error": probe.error,
        "checkpoint_bytes": nbytes, "on_disk_bytes": on_disk, "prior_s": prior,
        "torch_save_s": saved_s, "torch_save_fsync_s": durable_s, "torch_save_fsync_again_s": cold_durable_s,
        "dcp_save_fsync_s": dcp_s,
        "previous_checkpoint_s": previous.seconds if previous.bandwidth_bps else None,
        "previous_checkpoint_bytes": previous.written_bytes,
    }


def markdown(rounds: list[dict[str, Any]], load: tuple[float, float, float]) -> str:
    lines = [f"Load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.", "",
             "| round | probe: MB/s, MB written, s | checkpoint GB (counted / on disk) | prior s "
             "| torch.save s (÷ prior) | + fsync s (÷ prior) | again, save+fsync s (÷ prior) "
             "| DCP + fsync s (÷ prior) | DCP from file times s |",
             "|--:|--|--|--:|--:|--:|--:|--:|--:|"]
    for i, r in enumerate(rounds, start=1):
        prior = r["prior_s"]

        def cell(seconds: float | None, prior: float = prior) -> str:
            return "–" if seconds is None else f"{seconds:.1f} ({seconds / prior:.2f})"

        lines.append(
            f"| {i} | {r['probe_bandwidth_mb_s'] or 0:.0f}, {r['probe_written_mb']:.0f}, "
            f"{r['probe_s']:.2f} | {r['checkpoint_bytes'] / 1e9:.2f} / {r['on_disk_bytes'] / 1e9:.2f} | "
            f"{prior:.1f} | {cell(r['torch_save_s'])} | {cell(r['torch_save_fsync_s'])} | "
            f"{cell(r['torch_save_fsync_again_s'])} | {cell(r['dcp_save_fsync_s'])} | "
            f"{cell(r['previous_checkpoint_s'])} |")
    durable = ("torch_save_fsync_s", "torch_save_fsync_again_s", "dcp_save_fsync_s")
    ratios = [r[k] / r["prior_s"] for r in rounds for k in durable]
    logs = [math.log(x) for x in ratios]
    mean = sum(logs) / len(logs)
    sigma = math.sqrt(sum((x - mean) ** 2 for x in logs) / max(1, len(logs) - 1))
    lines += ["", f"Durable saves ÷ prior: {min(ratios):.2f} to {max(ratios):.2f}; log-normal fit: median "
              f"{math.exp(mean):.2f}, sigma {sigma:.2f} (n {len(ratios)})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=250e6,
                        help="fp32 parameters (250e6: 1 GB + 2 GB of Adam state)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="where to write (a temporary directory is made inside; default: the checkout)")
    parser.add_argument("--json", metavar="PATH")
    ns = parser.parse_args(argv)
    load = os.getloadavg()
    model, optimizer = build_state(ns.params)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="esiwrap-prior-", dir=ns.dir) as directory:
        for _ in range(ns.rounds):
            rounds.append(one_round(model, optimizer, directory))
    print(markdown(rounds, load))
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as out:
            json.dump({"load": load, "params": ns.params, "rounds": rounds}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
