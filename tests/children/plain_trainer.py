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
args = parser.parse_args()

start = json.loads(args.ckpt.read_text())["step"] if args.ckpt.exists() else 0
print(f"plain_trainer: start {start}", flush=True)
if not args.no_install:
    esi.install()
failures_left = args.fail_saves
for step in range(start + 1, args.steps + 1):
    time.sleep(args.step_seconds)
    esi.step_done(step)
    if esi.save_requested():
        try:
            with esi.saving(step, args.ckpt):
                time.sleep(args.save_seconds)
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
