"""A torch-free stand-in for a multi-rank launcher (used by tests): it starts N rank processes and
waits; each rank registers with `install(saves=...)` and saves when asked.

    python ranks_launcher.py --ranks 2 --savers rank0 --ckpt-dir DIR

Like torchrun's agent, the launcher itself never says hello. `--savers rank0`: only rank 0 writes
and acknowledges, the others declare `saves=False` and just clear the request.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import esiwrap.trainer as esi


def rank_main(rank: int, savers: str, ckpt_dir: Path, step_seconds: float) -> int:
    writes = savers == "all" or rank == 0
    esi.install(saves=writes)
    for step in range(1, 100_000):
        time.sleep(step_seconds)
        esi.step_done(step)
        if not esi.save_requested():
            continue
        if writes:
            with esi.saving(step, ckpt_dir / f"rank{rank}.txt"):
                (ckpt_dir / f"rank{rank}.txt").write_text(str(step))
        else:
            esi.clear()
        print(f"rank {rank}: save handled at step {step}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--savers", choices=("all", "rank0"), default="rank0")
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        return rank_main(args.rank, args.savers, args.ckpt_dir, args.step_seconds)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    children = [
        subprocess.Popen([sys.executable, __file__, *argv, "--rank", str(rank)],
                         env={**os.environ, "RANK": str(rank), "WORLD_SIZE": str(args.ranks)})
        for rank in range(args.ranks)
    ]
    return max(child.wait() for child in children)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
