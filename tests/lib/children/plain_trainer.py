"""Test trainer without torch (fast to start): the real esiwrap.trainer library around a loop
that sleeps for its steps and writes a JSON checkpoint atomically."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import esiwrap.trainer as esi

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", type=Path, required=True)
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument("--save-seconds", type=float, default=0.0)
parser.add_argument("--fail-saves", type=int, default=0, help="the first N saves raise")
parser.add_argument("--no-install", action="store_true")
parser.add_argument("--start-delay", type=float, default=0.0, help="seconds before install(): a slow import")
parser.add_argument("--own-save-every", type=int, default=0, help="also save on its own every N steps")
parser.add_argument("--save-growth", type=float, default=0.0, help="each save takes this much longer")
args = parser.parse_args()

time.sleep(args.start_delay)  # as importing torch does on a busy node
start = json.loads(args.ckpt.read_text())["step"] if args.ckpt.exists() else 0
print(f"plain_trainer: start {start}", flush=True)
if not args.no_install:
    esi.install()
failures_left = args.fail_saves
for step in range(start + 1, args.steps + 1):
    time.sleep(args.step_seconds)
    esi.step_done(step)
    own = args.own_save_every > 0 and step % args.own_save_every == 0
    if esi.save_requested() or own:
        try:
            with esi.saving(step, args.ckpt):
                time.sleep(args.save_seconds)
                args.save_seconds += args.save_growth
                if failures_left > 0:
                    failures_left -= 1
                    raise OSError("disk full (simulated)")
                tmp = args.ckpt.with_suffix(".tmp")
                tmp.write_text(json.dumps({"step": step}))
                os.replace(tmp, args.ckpt)
        except OSError as exc:
            print(f"plain_trainer: save failed: {exc}", flush=True)
            continue
        print(f"plain_trainer: saved {step}", flush=True)
print("plain_trainer: done", flush=True)
sys.exit(0)
