"""Test child: a plain Ray driver (no verl) that follows the README's five lines, with
`esiwrap.trainer.install()` before or after `ray.init(address=...)`. Each step runs a task on every
node of the cluster; a requested save writes a checkpoint atomically. Stopped with SIGINT
(KeyboardInterrupt), it shuts Ray down and says so.

    ray_plain_driver.py before|after CKPT_PATH
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import ray

import esiwrap.trainer as esi


@ray.remote(num_cpus=0)
def work(step: int) -> int:
    return step * 2


def save(path: str, step: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump({"step": step}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def main(order: str, path: str) -> int:
    if order == "before":
        esi.install()
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, logging_level=logging.ERROR)
    if order == "after":
        esi.install()
    print(f"driver ready, install() {order} ray.init", flush=True)
    try:
        for step in range(1, 1_000_000):
            assert ray.get([work.remote(step) for _ in range(2)]) == [step * 2] * 2
            time.sleep(0.2)
            esi.step_done(step)
            if esi.save_requested():
                with esi.saving(step, path):
                    save(path, step)
                    print(f"saved step {step}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: shutting Ray down", flush=True)
        ray.shutdown()
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
