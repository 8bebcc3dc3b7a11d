"""A job across three instances: the tiny PyTorch trainer under esiwrap, three runs one after the
other with one `--state-file`, each writing its own log (one per instance).

* run 1 saves to a local disk without `--upload`: `checkpoint_not_durable`, once;
* run 2 resumes from run 1's checkpoint: `resumed` with the right steps;
* run 3 starts from scratch (its checkpoint directory is empty, as on a new instance whose
  checkpoint was never copied back): `resume_missed`, with the steps it redoes and the causes.

Then `esiwrap report` of the three logs shows the job: each run's instance, deadline source and
exit, the work lost when each run ended and the steps redone, the totals; its HTML is opened in
headless Chromium. A checkpoint on a memory filesystem mounted for the test (tmpfs, in a private
mount namespace) is not warned about.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import Chromium, Png
from esiwrap_harness import PYTHON, ROOT, TINY_TRAINER, EsiwrapRun

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.shell.durability import filesystem_of
from esiwrap.times import iso_epoch
from esiwrap.tools import whatif
from esiwrap.tools.timeline import COLORS

pytestmark = [pytest.mark.system, pytest.mark.timeout(400)]
QUICK = ["--deadline", "+30s", "--stop-grace", "5", "--redundant-time", "6", "--save-duration", "1",
         "--final-margin", "2", "--log-level", "debug"]


@dataclass
class Job:
    logs: list[Path]
    runs: list[list[dict[str, Any]]]
    codes: list[int]
    state: dict[str, Any]


@pytest.fixture(scope="module")
def local_dir() -> Iterator[Path]:
    """A directory on the checkout's disk (a local block device on any test machine; /tmp may be
    a tmpfs)."""
    path = Path(tempfile.mkdtemp(prefix=".test-resume-", dir=ROOT))
    assert filesystem_of(str(path)).kind == "local", filesystem_of(str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(log: Path, state: Path, ckpt: Path) -> tuple[list[dict[str, Any]], int]:
    run = EsiwrapRun([*QUICK, "--log-file", str(log), "--state-file", str(state), "--",
                      PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(ckpt), "--step-seconds", "0.3"])
    try:
        code = run.finish(timeout=120)
    finally:
        run.kill()
    return [json.loads(line) for line in log.read_text().splitlines()], code


@pytest.fixture(scope="module")
def job(local_dir: Path) -> Job:
    state = local_dir / "esiwrap-state.json"
    logs = [local_dir / f"instance-{n}.jsonl" for n in (1, 2, 3)]
    ckpt = local_dir / "ckpt"
    results = [_run(logs[0], state, ckpt), _run(logs[1], state, ckpt)]
    results.append(_run(logs[2], state, local_dir / "ckpt-never-copied-back"))
    return Job(logs, [r[0] for r in results], [r[1] for r in results], json.loads(state.read_text()))


def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def test_a_local_disk_checkpoint_without_upload_is_named_once(job: Job) -> None:
    """At the first completed save on a local disk and no --upload: one `checkpoint_not_durable`
    with the path, the filesystem type and the fix, however many saves follow."""
    first = job.runs[0]
    assert len(named(first, "save_completed")) >= 2
    (warning,) = named(first, "checkpoint_not_durable")
    assert warning["level"] == "warning"
    assert warning["path"] == named(first, "save_completed")[0]["path"]
    assert warning["filesystem"] == filesystem_of(warning["path"]).fstype
    assert "--upload" in warning["fix"] and "--local-checkpoints-survive" in warning["fix"]


def test_the_state_file_records_the_last_durable_checkpoint(job: Job) -> None:
    """The state file names the last checkpoint (step, path, time) of the last run that saved."""
    last_save = named(job.runs[2], "save_completed")[-1]
    checkpoint = job.state["checkpoint"]
    assert checkpoint["step"] == last_save["step"] and checkpoint["path"] == last_save["path"]
    assert checkpoint["durable"] == "completed" and checkpoint["at"] > 0


def test_a_run_that_resumes_logs_resumed_with_the_right_steps(job: Job) -> None:
    """Run 2 starts from run 1's last checkpoint: `resumed`, nothing redone."""
    assert job.codes == [EXIT_CHECKPOINTED] * 3
    checkpoint = named(job.runs[0], "save_completed")[-1]
    (resumed,) = named(job.runs[1], "resumed")
    assert resumed["checkpoint_step"] == checkpoint["step"] == resumed["start_step"]
    assert resumed["steps_redone"] == 0 and resumed["path"] == checkpoint["path"]
    first_step = named(job.runs[1], "step_observed")[0]["step"]
    assert first_step == checkpoint["step"] + 1
    assert not named(job.runs[1], "resume_missed")


def test_a_run_that_starts_from_scratch_despite_a_checkpoint_logs_resume_missed(job: Job) -> None:
    """Run 3 starts from step 0 although run 2 left a checkpoint: `resume_missed` (a warning) with
    the steps it redoes and what to check."""
    checkpoint = named(job.runs[1], "save_completed")[-1]
    (missed,) = named(job.runs[2], "resume_missed")
    assert missed["level"] == "warning"
    assert missed["checkpoint_step"] == checkpoint["step"] and missed["start_step"] == 0
    assert missed["steps_redone"] == checkpoint["step"]
    assert any(checkpoint["path"] in cause for cause in missed["causes"])
    assert not named(job.runs[2], "resumed")


def test_report_shows_the_job_across_three_instances(job: Job) -> None:
    """Three logs (one per instance) are one job: each run's instance, deadline source and exit,
    the work lost when it ended and the steps redone by the next run, and the totals; the same
    job as one concatenated log."""
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", "--json", *map(str, job.logs)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["job"]
    runs = report["runs"]
    assert [r["run_id"] for r in runs] == [events[0]["run_id"] for events in job.runs]
    host = named(job.runs[0], "child_started")[0]["host"]
    assert all(r["instance"] == host and r["deadline_source"] == "cli" for r in runs)
    assert [r["exit_code"] for r in runs] == job.codes
    for r, events in zip(runs, job.runs, strict=True):
        last_save = named(events, "save_completed")[-1]
        assert r["checkpoint_step"] == last_save["step"]
        exit_event = named(events, "supervisor_exit")[0]
        assert r["last_step"] == exit_event["last_step"]
        assert r["lost_steps"] == r["last_step"] - last_save["step"]
        assert 0 <= r["lost_s"] < 5
    assert [r["steps_redone"] for r in runs] == [0, named(job.runs[1], "save_completed")[-1]["step"], 0]
    assert report["steps_redone"] == runs[1]["steps_redone"]
    assert report["lost_s"] == pytest.approx(sum(r["lost_s"] for r in runs), abs=0.01)
    assert report["saving_s"] == pytest.approx(
        sum(e["duration_s"] for events in job.runs for e in named(events, "save_completed")), abs=0.01)
    assert report["reclamations"] == 3

    text = subprocess.run([PYTHON, "-m", "esiwrap", "report", *map(str, job.logs)], capture_output=True,
                          text=True, timeout=60).stdout
    block = text[text.index("job  3 runs"):]
    assert "totals" in block and f"{runs[1]['steps_redone']} steps redone after resuming" in block
    assert "RESUME MISSED" in text
    joined = "".join(log.read_text() for log in job.logs)
    same = subprocess.run([PYTHON, "-m", "esiwrap", "report", "--json", "-"], input=joined,
                          capture_output=True, text=True, timeout=60)
    assert json.loads(same.stdout)["job"] == report


@pytest.mark.parametrize("left_out", [(), ("step_observed",), ("step_observed", "resumed", "state_loaded")],
                         ids=["as-logged", "info-level", "no-state-file"])
def test_what_if_numbers_a_resumed_runs_steps_from_where_it_resumed(
        job: Job, tmp_path: Path, left_out: tuple[str, ...]) -> None:
    """`report --what-if` of run 2, which resumed from run 1's checkpoint: its actual column is
    the report's own figures (the saves and their steps, the checkpoint of the `at risk` line) and
    its work lost is the time from that checkpoint's step to the deadline, not the whole run (its
    steps were once numbered from 0); the replay with the run's own settings saves the same steps.
    Also from the log as `--log-level info` writes it (no step_observed: steps at one pace),
    and without a state file's events (the start estimated from the first save)."""
    (resumed,) = named(job.runs[1], "resumed")
    log = tmp_path / "run-2.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in job.runs[1] if e["event"] not in left_out))
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", "--json", str(log), "--what-if",
                           "--redundant-time 3"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    ((run,), (replayed,)) = document["runs"], document["what_if"]
    exact = "resumed" not in left_out
    assert replayed["start_from"] == (whatif.AS_RESUMED if exact else whatif.ESTIMATED)
    assert abs(replayed["start_step"] - resumed["start_step"]) <= (0 if exact else 2)
    actual = replayed["actual"]
    completed = [s for s in run["saves"] if s["outcome"] == "completed"]
    assert [(s["kind"], s["step"]) for s in actual["saves"]] == [(s["kind"], s["step"]) for s in completed]
    assert actual["saved_step"] == run["work_at_risk"]["step"] == completed[-1]["step"]
    assert actual["saved_step"] > resumed["start_step"]
    to_deadline = iso_epoch(run["deadline"]["at"]) - iso_epoch(completed[-1]["started_at"])
    assert actual["lost_s"] == pytest.approx(to_deadline, abs=0.5 if "step_observed" not in left_out else 1.5)
    assert run["work_at_risk"]["seconds"] <= actual["lost_s"] < 10
    assert abs(replayed["replayed_as_run"]["saved_step"] - actual["saved_step"]) <= 2
    assert replayed["replayed_as_run"]["saves"][0]["step"] > resumed["start_step"]


JOB_GEOMETRY = """
(() => {
  const box = el => {
    const b = el.getBoundingClientRect();
    return {x: b.left, y: b.top, w: b.width, h: b.height};
  };
  const all = (sel, root = document) => Array.from(root.querySelectorAll(sel));
  return {
    rows: all('section.job g.job-run').map(g => ({run: g.dataset.runId, exit: g.dataset.exit,
      span: box(g.querySelector('rect.job-span')), saves: all('rect.job-save', g).length,
      lost: all('rect.job-lost', g).map(box), label: g.querySelector('text.job-exit').textContent})),
    table: all('section.job table.job-table tr').map(tr => all('td, th', tr).map(c => c.textContent)),
    sections: all('section.run').length,
  };
})()
"""


def test_job_page_renders_in_chromium(job: Job, tmp_path: Path) -> None:
    """The HTML page opens with the job: a row per run in time order, its saves on it, the lost
    work in red, its exit; the table has a row per run and the totals; each run follows."""
    page_file = tmp_path / "job.html"
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", *map(str, job.logs), "--html", str(page_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with Chromium(tmp_path) as browser:
        page = browser.open(page_file.as_uri())
        got = page.evaluate(JOB_GEOMETRY)
        shot = page.screenshot()
        (tmp_path / "job.png").write_bytes(shot)
    rows = got["rows"]
    assert [r["run"] for r in rows] == [events[0]["run_id"] for events in job.runs]
    assert [r["exit"] for r in rows] == [str(c) for c in job.codes]
    assert all(r["label"] == f"exit {c}" for r, c in zip(rows, job.codes, strict=True))
    xs = [r["span"]["x"] for r in rows]
    assert xs == sorted(xs) and all(r["span"]["w"] > 20 for r in rows)
    for r, events in zip(rows, job.runs, strict=True):
        assert r["saves"] == len(named(events, "save_completed"))
        for lost in r["lost"]:  # at the end of the run's bar
            assert lost["x"] + lost["w"] <= r["span"]["x"] + r["span"]["w"] + 1
    table = got["table"]
    assert len(table) == 1 + 3 + 1 and table[-1][0] == "total"
    assert table[2][7] == f"{named(job.runs[1], 'save_completed')[-1]['step']} steps"  # redone after run 2
    assert got["sections"] == 3
    assert Png(shot).share_of(COLORS["completed"]) > 0


def test_a_checkpoint_on_a_memory_filesystem_is_not_warned_about(tmp_path: Path) -> None:
    """A tmpfs mounted for this test (in a private mount namespace) is not a local disk: no
    `checkpoint_not_durable`."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    log = tmp_path / "run.jsonl"
    script = (f"mount -t tmpfs esiwrap-test {mount} && exec {PYTHON} -m esiwrap --deadline +25s "
              f"--redundant-time 6 --save-duration 1 --no-final-save --log-file {log} -- {PYTHON} "
              f"{TINY_TRAINER} --ckpt-dir {mount}/ckpt --step-seconds 0.3")
    run = EsiwrapRun(["--mount", "--propagation", "private", "sh", "-c", script], launcher=("unshare",))
    try:
        code = run.finish(timeout=120)
    finally:
        run.kill()
    assert code == EXIT_CHECKPOINTED, run.other_lines[-5:]
    names = [e["event"] for e in map(json.loads, log.read_text().splitlines())]
    assert "save_completed" in names and "checkpoint_not_durable" not in names
