"""`--upload` retries at the stop (issue 24), end to end: the tiny PyTorch trainer under esiwrap,
the real `aws` CLI against a real S3-compatible server on loopback (moto's), behind a throttle that
refuses the first two requests the way S3 does (`SlowDown`), then lets them through.

esiwrap is stopped by SIGTERM (a checkpoint, then the stop) with the deadline ten minutes away: the
checkpoint's first upload fails as the child stops, the second 5 s later, the third, 30 s after
that, completes. esiwrap exits 75, after the upload, and the store holds the checkpoint.
"""

from __future__ import annotations

import io
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, TINY_TRAINER, EsiwrapRun, event_time
from s3_store import S3Store, store_with_bucket

from esiwrap.errors import EXIT_CHECKPOINTED

pytestmark = pytest.mark.timeout(240)

THROTTLE = """\
import os, sys, time
count_file, refusals = sys.argv[1], int(sys.argv[2])
seen = int(open(count_file).read()) if os.path.exists(count_file) else 0
open(count_file, "w").write(str(seen + 1))
if seen < refusals:
    time.sleep(0.5)
    print("An error occurred (SlowDown) when calling the PutObject operation: Please reduce your "
          "request rate.", file=sys.stderr)
    sys.exit(1)
os.execvp(sys.argv[3], sys.argv[3:])
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[S3Store]:
    with store_with_bucket(tmp_path, "ckpt") as s3:
        yield s3


def test_an_upload_refused_twice_at_the_stop_is_retried_and_exits_75(tmp_path: Path, store: S3Store,
                                                                      esiwrap) -> None:
    throttle = tmp_path / "throttle.py"
    throttle.write_text(THROTTLE)
    counter = shlex.quote(str(tmp_path / "n"))
    upload = (f"{shlex.quote(sys.executable)} {shlex.quote(str(throttle))} {counter} 2 "
              f"{store.upload_command('ckpt', 'job/{step}/latest.pt')}")
    run: EsiwrapRun = esiwrap(
        "--deadline", "+10m", "--stop-grace", "10", "--upload", upload, "--upload-duration", "10",
        "--log-level", "debug", "--",
        PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(tmp_path / "ckpt"), "--step-seconds", "0.2",
        env=store.env("retries"))
    run.wait_event("step_observed", 60)
    run.signal(signal.SIGTERM)
    code = run.finish(timeout=180)
    assert code == EXIT_CHECKPOINTED, [(e["event"], e.get("reason")) for e in run.events]
    failed = [e for e in run.events if e["event"] == "upload_failed"]
    assert len(failed) == 2 and all(any("SlowDown" in line for line in f["stderr"]) for f in failed)
    (done,) = [e for e in run.events if e["event"] == "upload_completed"]
    assert done["attempt"] == 3
    exited = event_time(run.first("child_exited"))
    assert event_time(failed[1]) > exited  # refused at the stop, and tried again all the same
    planned = [e for e in run.events if e["event"] == "upload_retry_planned"]
    assert [p["attempt"] for p in planned][-2:] == [2, 3] and planned[-1]["in_s"] == 30.0
    names = [e["event"] for e in run.events]
    assert names.index("upload_completed") < names.index("supervisor_exit")
    import torch

    step = run.first("save_completed")["step"]
    saved = torch.load(io.BytesIO(store.read("ckpt", f"job/{step}/latest.pt")), weights_only=True)
    assert saved["step"] == step
