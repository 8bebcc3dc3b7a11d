"""Which lines `esiwrap report` takes: esiwrap events wherever the journal put them, nothing else."""

from __future__ import annotations

import json
import signal

from esiwrap.core.policy import quantile
from esiwrap.signals import signal_label
from esiwrap.tools.report import event_of, exit_meaning, read_events, split_runs, summarize

EVENT = {"timestamp": "2026-11-30T02:00:00.000Z", "level": "info", "event": "child_started",
         "run_id": "abc123", "pid": 7}
LINE = json.dumps(EVENT)


def test_event_found_behind_journal_prefixes() -> None:
    """Bare JSON, a `<6>` priority prefix, `journalctl` short output and `-o json` all work."""
    short = f"Nov 30 02:00:00 host esiwrap[7]: {LINE}"
    as_json = json.dumps({"MESSAGE": LINE, "_PID": "7", "ESIWRAP_JOB": "llama"})
    for line in (LINE, f"<6>{LINE}", short, as_json, LINE + " trailing"):
        assert event_of(line) == EVENT, line


def test_other_lines_are_skipped_and_counted() -> None:
    """Trainer output, JSON that is not an esiwrap event, a cut-off line, a bad timestamp."""
    others = ["tiny_trainer: saved step 3", '{"loss": 0.1}', LINE[:40], "[1, 2]",
              json.dumps({**EVENT, "timestamp": "yesterday"}), json.dumps({**EVENT, "run_id": 5})]
    found = read_events([*others, "", LINE])
    assert found.events == [EVENT] and found.skipped == len(others)


def test_runs_are_split_by_run_id_in_start_order() -> None:
    """Interleaved runs come apart; each run's events, and the runs, are put in time order."""
    later = {**EVENT, "run_id": "def456", "timestamp": "2026-11-30T01:59:00.000Z"}
    late_line = {**EVENT, "event": "supervisor_exit", "timestamp": "2026-11-30T02:00:05.000Z"}
    early_line = {**EVENT, "event": "deadline_resolved", "timestamp": "2026-11-30T01:59:59.000Z"}
    runs = split_runs([EVENT, later, late_line, early_line])
    assert [[e["event"] for e in run] for run in runs] == [
        ["child_started"], ["deadline_resolved", "child_started", "supervisor_exit"]]
    assert runs[0][0]["run_id"] == "def456"


def test_step_quantile_is_the_policys_nearest_rank() -> None:
    """The report's p99 step is `policy.quantile`'s nearest rank: a step that occurred, the same
    figure the policy plans with (101 steps: the 100th longest, not an interpolation)."""
    steps = [{**EVENT, "event": "step_observed", "step": i, "duration_s": float(i)} for i in range(1, 102)]
    figures = summarize([EVENT, *steps]).steps
    assert figures["p99_s"] == quantile([float(i) for i in range(1, 102)], 0.99) == 100.0
    assert (figures["observed"], figures["max_s"]) == (101, 101.0)


def test_exit_codes_past_128_name_the_signal_as_esiwrap_writes_it() -> None:
    """128+N names signal N the way `signals.signal_label` writes it (real-time ones as
    SIGRTMIN+K); a number that is no signal is the command's own code."""
    assert exit_meaning(128 + signal.SIGKILL) == "the command was killed by SIGKILL"
    rt = int(signal.SIGRTMIN) + 3
    assert exit_meaning(128 + rt) == f"the command was killed by {signal_label(rt)}"
    assert signal_label(rt) == "SIGRTMIN+3"
    assert exit_meaning(128 + 72) == "the command's own exit code"


def test_the_stop_line_names_the_trainer_stopped_first_and_whether_the_command_needed_a_signal() -> None:
    """A Ray driver below `bash run.sh` got its SIGINT first: the stop line says so, and says
    whether bash then needed its own SIGTERM (`child_stop_signalled`) or exited with the driver."""
    from esiwrap.tools.report import render_text

    stopping = {**EVENT, "event": "child_stopping", "timestamp": "2026-11-30T02:00:01.000Z",
                "signal": "SIGTERM", "grace_s": 30.0, "reason": "checkpoint complete",
                "first": [{"pid": 8, "signal": "SIGINT"}]}
    alone = render_text([summarize([EVENT, stopping])], 0)
    assert "SIGINT to pid 8 first (the trainer below the command); the command not signalled" in alone
    signalled = {**EVENT, "event": "child_stop_signalled", "timestamp": "2026-11-30T02:00:04.000Z"}
    then = render_text([summarize([EVENT, stopping, signalled])], 0)
    assert "SIGINT to pid 8 first (the trainer below the command), then SIGTERM to the command at" in then


def test_the_restore_and_each_checkpoints_verification_have_their_lines() -> None:
    """`--restore` and verification in the report: what came back (and the manifest that named
    it) before the command started, and each checkpoint's verdict, in the text and the JSON."""
    from esiwrap.tools.report import render_text

    def at(second: int, event: str, **fields: object) -> dict[str, object]:
        return {**EVENT, "timestamp": f"2026-11-30T02:00:{second:02d}.000Z", "event": event, **fields}

    events = [
        at(0, "manifest_found", step=1200, path="/ckpt/global_step_1200"),
        at(1, "restored", step=1200, path="/ckpt/global_step_1200", seconds=41.2, bytes=5, files=2,
           format="verl", attempt=1),
        {**EVENT, "timestamp": "2026-11-30T02:00:02.000Z"},  # child_started
        at(3, "checkpoint_verified", step=1210, path="/ckpt/global_step_1210", format="verl", seconds=0.004,
           by="built-in"),
        at(4, "checkpoint_invalid", step=1220, path="/ckpt/global_step_1220", format="verl", seconds=0.002,
           by="built-in", problem="latest_checkpointed_iteration.txt is missing"),
        at(5, "supervisor_exit", code=75, reason="checkpoint complete"),
    ]
    run = summarize(events)
    assert run.restore is not None
    restored = (run.restore["outcome"], run.restore["step"], run.restore["manifest_step"])
    assert restored == ("brought back", 1200, 1200)
    assert [(v["step"], v["outcome"]) for v in run.verifications] == [(1210, "valid"), (1220, "invalid")]
    text = render_text([run], 0)
    restore = next(line for line in text.splitlines() if line.strip().startswith("restore"))
    assert "step 1200 back to /ckpt/global_step_1200 in 41.2s, attempt 1" in restore
    assert "newest manifest, step 1200" in restore
    verify = [line for line in text.splitlines() if line.strip().startswith("verify")]
    assert "step 1210 valid (verl" in verify[0]
    assert "step 1220 INVALID: latest_checkpointed_iteration.txt is missing" in verify[1]
    skipped = summarize([at(0, "restore_skipped", reason="no complete manifest was found"), EVENT])
    assert "nothing to restore: no complete manifest was found" in render_text([skipped], 0)
