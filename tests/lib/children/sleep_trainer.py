"""A trainer whose steps and saves are sleeps: `sleep_trainer.py STEP_S SAVE_S`."""

from __future__ import annotations

import sys
import time

import esiwrap.trainer as esi


def main() -> None:
    step_s, save_s = float(sys.argv[1]), float(sys.argv[2])
    esi.install()
    step = 0
    while True:
        step += 1
        time.sleep(step_s)
        esi.step_done(step)
        if esi.save_requested():
            with esi.saving(step):
                time.sleep(save_s)


if __name__ == "__main__":
    main()
