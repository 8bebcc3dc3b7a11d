"""`esiwrap report LOG --svg OUT.svg --html OUT.html`: a run as a picture.

One picture per run, four lanes on one time axis: the deadline (each value esiwrap learned, and
when it moved), training (each step, when the log has `step_observed`, i.e. `--log-level
debug`; else the span the trainer was attached), the saves (planned signal, actual signal, the
wait for the step boundary, the write), and the signals (save signal, stop signal, SIGKILL, the
exit). Deadlines are vertical lines across every lane, so "did the save land before it?" is
answered by looking. Plain SVG: no script, no font or file from anywhere else; the HTML page
wraps the pictures with the figures of `esiwrap report` and works offline.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from esiwrap import events as ev
from esiwrap.times import iso_epoch, iso_utc
from esiwrap.tools.report import Event, JobReport, RunReport, job_report, render_job, render_text, summarize

WIDTH = 1200
LEFT = 118  # lane labels live left of this
RIGHT = 36
HEADER = 64
LANE_GAP = 8
LANES = (("deadline", 54), ("training", 52), ("saves", 86), ("signals", 58))
AXIS = 46
FONT = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif"
COLORS = {
    "deadline": "#d62728", "superseded": "#9a9a9a", "step_a": "#9ecae1", "step_b": "#6baed6",
    "training": "#9ecae1", "completed": "#2ca02c", "failed": "#d62728", "missed": "#d62728",
    "not acknowledged": "#ff7f0e", "planned": "#444444", "signal": "#9467bd", "stop": "#222222",
    "kill": "#d62728", "own save": "#8c8c8c", "warning": "#ff7f0e", "text": "#222222", "muted": "#666666",
    "grid": "#e6e6e6", "upload": "#17becf",
}
SIGNAL_LABEL_SIZE = 10
SIGNAL_ROW_PX = 15  # one row of signal labels
SIGNAL_LANE_MIN = 58  # the signals lane grows beyond this when its labels need more rows
# DejaVu Sans (the font named first) advance widths in em, for the characters labels hold: a label's
# width is known before it is drawn, so two labels can be kept apart. Other fonts of the list are
# narrower; a character not listed counts as 1 em.
_EM_WIDTHS = {
    **dict.fromkeys("'", 0.275), **dict.fromkeys("ijl", 0.278), **dict.fromkeys("IJ", 0.295),
    **dict.fromkeys(" ,.·", 0.318), **dict.fromkeys("/:;\\|", 0.337), "f": 0.352, "-": 0.361,
    **dict.fromkeys("()[]", 0.39), "t": 0.392, "!": 0.401, "r": 0.411, '"': 0.46,
    **dict.fromkeys("*_`", 0.5), "s": 0.521, "z": 0.525, "?": 0.531, "c": 0.55, "L": 0.557, "F": 0.575,
    "k": 0.579, **dict.fromkeys("vxy", 0.592), "P": 0.603, **dict.fromkeys("TY", 0.611), "o": 0.612,
    "a": 0.613, "e": 0.615, "E": 0.632, **dict.fromkeys("hnu", 0.634), **dict.fromkeys("Sbdgpq", 0.635),
    **dict.fromkeys("$0123456789{}", 0.636), "K": 0.656, **dict.fromkeys("AV", 0.684),
    **dict.fromkeys("XZ", 0.685), "B": 0.686, "R": 0.695, "C": 0.698, "U": 0.732, "N": 0.748, "H": 0.752,
    **dict.fromkeys("◇▼", 0.769), "D": 0.77, "G": 0.775, "&": 0.78, **dict.fromkeys("OQ", 0.787),
    "w": 0.818, **dict.fromkeys("#+<=>^~→−✓×", 0.838), "M": 0.863, "●": 0.873, "%": 0.95, "m": 0.974,
    "W": 0.989,
}
OFF_SCALE = 1.5  # a deadline later than the end by more than 1.5 times the run: drawn at the edge
_DRAWN_ELSEWHERE = frozenset({ev.DEADLINE_CHANGED})  # warnings the deadline lane already shows
MAX_STEP_RECTS = 1500  # beyond this, the training band is one bar with step numbers on it


# ---------------------------------------------------------------------- facts
@dataclass
class DeadlineMark:
    at: float
    source: str
    known_at: float
    replaced_at: float | None = None  # when a newer value took its place


@dataclass
class SaveMark:
    kind: str
    reason: str
    outcome: str
    signal: float
    planned: float | None
    first_planned: float | None
    started: float | None
    completed: float | None
    step: int | None
    duration_s: float | None
    remaining_s: float | None


@dataclass
class Facts:
    """What the picture shows of one run, in epoch seconds."""

    run: RunReport
    start: float
    end: float
    steps: list[tuple[float, float, int]] = field(default_factory=list)  # (begin, end, step)
    attached: tuple[float, float] | None = None  # training span when steps are not in the log
    deadlines: list[DeadlineMark] = field(default_factory=list)
    saves: list[SaveMark] = field(default_factory=list)
    own_saves: list[tuple[float, float, Any]] = field(default_factory=list)  # trainer's: (begin, end, step)
    signals: list[tuple[float, str, str, str]] = field(default_factory=list)  # (at, kind, label, detail)
    warnings: list[tuple[float, str]] = field(default_factory=list)


def facts_of(events: Sequence[Event]) -> Facts:
    """The picture's facts from one run's events (in time order), via `esiwrap report`'s figures."""
    run = summarize(events)
    facts = Facts(run=run, start=iso_epoch(run.started_at), end=iso_epoch(run.ended_at))
    facts.steps = _steps(events)
    facts.attached = _attached(events, facts.end)
    facts.deadlines = _deadline_marks(run)
    facts.saves = [_save_mark(s) for s in run.saves]
    facts.own_saves = [(iso_epoch(t["at"]) - float(t.get("duration_s") or 0.0), iso_epoch(t["at"]),
                        t.get("step")) for t in run.trainer_saves]
    facts.signals = _signals(events, run)
    facts.warnings = [(iso_epoch(w["at"]), str(w["event"])) for w in run.warnings
                      if w["event"] not in _DRAWN_ELSEWHERE]
    return facts


def _steps(events: Sequence[Event]) -> list[tuple[float, float, int]]:
    steps = []
    for e in events:
        if e["event"] == ev.STEP_OBSERVED and isinstance(e.get("duration_s"), (int, float)):
            end = iso_epoch(e["timestamp"])
            steps.append((end - float(e["duration_s"]), end, int(e.get("step") or 0)))
    return steps


def _attached(events: Sequence[Event], end: float) -> tuple[float, float] | None:
    begin = next((iso_epoch(e["timestamp"]) for e in events if e["event"] == ev.TRAINER_ATTACHED), None)
    if begin is None:
        return None
    stop = next((iso_epoch(e["timestamp"]) for e in events if e["event"] == ev.CHILD_EXITED), end)
    return begin, stop


def _deadline_marks(run: RunReport) -> list[DeadlineMark]:
    if run.deadline is None or not isinstance(run.deadline.get("at"), str):
        return []
    marks = [DeadlineMark(iso_epoch(run.deadline["at"]), str(run.deadline.get("source")),
                          iso_epoch(run.deadline["logged_at"]))]
    for change in run.deadline_changes:
        if not isinstance(change.get("new"), str):
            continue
        known = iso_epoch(change["logged_at"])
        marks[-1].replaced_at = known
        marks.append(DeadlineMark(iso_epoch(change["new"]), str(change.get("source")), known))
    return marks


def _save_mark(s: Any) -> SaveMark:
    def at(value: Any) -> float | None:
        return iso_epoch(value) if isinstance(value, str) else None

    return SaveMark(kind=s.kind, reason=s.reason, outcome=s.outcome, signal=iso_epoch(s.requested_at),
                    planned=at(s.planned_signal_at), first_planned=at(s.first_planned_at),
                    started=at(s.started_at), completed=at(s.completed_at), step=s.step,
                    duration_s=s.duration_s, remaining_s=s.remaining_s)


def _signals(events: Sequence[Event], run: RunReport) -> list[tuple[float, str, str, str]]:
    """(at, kind, label, detail for the tooltip) of each signal sent and each exit."""
    marks: list[tuple[float, str, str, str]] = []
    for e in events:
        name, at = e["event"], iso_epoch(e["timestamp"])
        if name == ev.SAVE_REQUESTED and e.get("pids"):
            marks.append((at, "signal", f"{e.get('signal') or 'SIGUSR1'} → {_pids(e.get('pids'))}", ""))
        elif name == ev.CHILD_STOPPING:
            marks.append((at, "stop", str(e.get("signal")), f"stop: {e.get('reason')}"))
        elif name == ev.CHILD_KILLED:
            marks.append((at, "kill", f"SIGKILL → {_pids(e.get('pids'))}", ""))
        elif name == ev.CHILD_EXITED:
            how = str(e.get("signal")) if e.get("signal") else f"exit {e.get('code')}"
            marks.append((at, "exit", f"child: {how}", ""))
        elif name == ev.SUPERVISOR_EXIT:
            marks.append((at, "exit", f"esiwrap: exit {e.get('code')}", str(e.get("reason") or "")))
    return marks


def _pids(value: Any) -> str:
    return ",".join(str(p) for p in value) if isinstance(value, list) else str(value)


# ---------------------------------------------------------------------- drawing
@dataclass
class SignalLabel:
    """One label of the signals lane: the marks it names (those a few pixels apart share one),
    and where it goes: its row and horizontal span, chosen before anything is drawn."""

    marks: list[tuple[float, str, str, str]]
    text: str
    row: int
    left: float
    right: float


class Canvas:
    """SVG elements of one run's picture, with the time-to-x mapping."""

    def __init__(self, facts: Facts, top: float) -> None:
        self.facts = facts
        self.top = top
        self.parts: list[str] = []
        self.t0 = facts.start
        latest = max([facts.end, *(m.at for m in facts.deadlines if self._on_scale(m.at))])
        span = max(latest - self.t0, 1.0)
        self.t1 = latest + span * 0.02
        self.signal_labels = _layout_signal_labels(self)  # the signals lane is as tall as they need
        rows = 1 + max((label.row for label in self.signal_labels), default=0)
        heights = {**dict(LANES), "signals": max(SIGNAL_LANE_MIN, 33 + (rows - 1) * SIGNAL_ROW_PX)}
        self.lanes: dict[str, tuple[float, float]] = {}
        y = top + HEADER
        for name, _ in LANES:
            self.lanes[name] = (y, y + heights[name])
            y += heights[name] + LANE_GAP
        self.bottom = y
        self.height = y + AXIS - top

    def _on_scale(self, at: float) -> bool:
        span = max(self.facts.end - self.facts.start, 1.0)
        return at <= self.facts.end + OFF_SCALE * span

    def x(self, t: float) -> float:
        width = WIDTH - LEFT - RIGHT
        return LEFT + (min(max(t, self.t0), self.t1) - self.t0) / (self.t1 - self.t0) * width

    def add(self, element: str) -> None:
        self.parts.append(element)


def render_svg(runs: Sequence[Sequence[Event]]) -> str:
    """One SVG document with a picture per run, stacked; with several runs, the job's first."""
    body, top = [], 0.0
    if len(runs) > 1:
        job, height = _job_picture(runs, top)
        body.append(job)
        top += height + 24
    for events in runs:
        canvas = Canvas(facts_of(events), top)
        _draw(canvas)
        body.append(f'<g class="run" data-run-id="{_esc(canvas.facts.run.run_id)}">' + "".join(canvas.parts)
                    + "</g>")
        top += canvas.height + 24
    height = max(top - 24, 1.0)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
            f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="{FONT}" font-size="12" '
            f'role="img" aria-label="esiwrap run timeline">'
            f'<rect width="100%" height="100%" fill="#ffffff"/>' + "".join(body) + "</svg>\n")


def _draw(c: Canvas) -> None:
    _header(c)
    _lanes(c)
    _axis(c)
    _training(c)
    _resume(c)
    _at_risk(c)
    _saves(c)
    _signal_marks(c)
    _deadlines(c)  # last: the lines cross every lane, on top


def _header(c: Canvas) -> None:
    """The outcome first (what a person looks for), then when, the saves and what was at risk."""
    run = c.facts.run
    title = (f"exit {run.exit_code}: {run.exit_meaning}" if run.exit_code is not None
             else "no supervisor_exit: the log stops here (instance gone?)")
    c.add(_text(16, c.top + 22, _short(title, 110), size=16, weight="bold", cls="title"))
    saved = sum(1 for s in run.saves if s.outcome == "completed")
    line = (f"run {run.run_id} · {_clock(c.facts.start)} → {_clock(c.facts.end)} UTC "
            f"({_dur(run.duration_s)}) · {saved} of {len(run.saves)} requested saves completed · "
            f"work at risk {_dur(run.work_at_risk.get('seconds'))}")
    if run.resume is not None:
        line += (f" · resumed at step {run.resume.get('start_step')}" if run.resume["from_checkpoint"]
                 else f" · RESUME MISSED ({run.resume.get('steps_redone')} steps redone)")
    if run.command:
        line += " · " + " ".join(run.command)
    c.add(_text(16, c.top + 44, _short(line, 180), size=12, fill=COLORS["muted"], cls="subtitle"))


def _lanes(c: Canvas) -> None:
    for name, (y0, y1) in c.lanes.items():
        c.add(f'<rect class="lane lane-{name}" x="{LEFT}" y="{y0:.1f}" width="{WIDTH - LEFT - RIGHT}" '
              f'height="{y1 - y0:.1f}" fill="#fafafa" stroke="{COLORS["grid"]}"/>')
        c.add(_text(LEFT - 10, (y0 + y1) / 2 + 4, name, anchor="end", weight="bold", cls="lane-label"))


def _axis(c: Canvas) -> None:
    step = _tick_step(c.t1 - c.t0)
    y0, y1 = c.lanes["deadline"][0], c.bottom - LANE_GAP
    k = 0
    while c.t0 + k * step <= c.t1:
        t = c.t0 + k * step
        x = c.x(t)
        c.add(f'<line class="grid" x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}" '
              f'stroke="{COLORS["grid"]}"/>')
        c.add(_text(x, y1 + 16, f"+{_dur(k * step)}", anchor="middle", cls="tick"))
        c.add(_text(x, y1 + 31, _clock(t), anchor="middle", size=10, fill=COLORS["muted"], cls="tick-clock"))
        k += 1


def _training(c: Canvas) -> None:
    y0, y1 = c.lanes["training"]
    top, bottom = y0 + 8, y1 - 8
    steps = c.facts.steps
    if steps and len(steps) <= MAX_STEP_RECTS:
        for i, (begin, end, step) in enumerate(steps):
            x0, x1 = c.x(begin), c.x(end)
            fill = COLORS["step_a"] if step % 2 else COLORS["step_b"]
            c.add(f'<rect class="step" data-step="{step}" x="{x0:.2f}" y="{top:.1f}" '
                  f'width="{max(x1 - x0, 0.5):.2f}" height="{bottom - top:.1f}" fill="{fill}">'
                  f'<title>step {step}: {end - begin:.3f}s, ended {_clock(end, ms=True)}</title></rect>')
            del i
        _step_labels(c, steps, top)
    elif steps or c.facts.attached:
        begin = steps[0][0] if steps else c.facts.attached[0]  # type: ignore[index]
        end = steps[-1][1] if steps else c.facts.attached[1]  # type: ignore[index]
        c.add(f'<rect class="training-span" x="{c.x(begin):.1f}" y="{top:.1f}" '
              f'width="{max(c.x(end) - c.x(begin), 1):.1f}" height="{bottom - top:.1f}" '
              f'fill="{COLORS["training"]}"><title>trainer attached {_clock(begin)}–{_clock(end)} '
              f'(steps are in the log with --log-level debug)</title></rect>')
        if steps:
            _step_labels(c, steps, top)
    else:
        c.add(_text((LEFT + WIDTH - RIGHT) / 2, (y0 + y1) / 2 + 4, "no trainer attached", anchor="middle",
                    fill=COLORS["muted"], cls="no-training"))


def _resume(c: Canvas) -> None:
    """Where the run started, when a state file named the job's last durable checkpoint
    (`resumed`, `resume_missed`): a tick at the trainer's first step and what it started from."""
    resume = c.facts.run.resume
    if resume is None or not isinstance(resume.get("at"), str):
        return
    y0, y1 = c.lanes["training"]
    x = c.x(iso_epoch(resume["at"]))
    if resume["from_checkpoint"]:
        text, color = f"resumed at step {resume.get('start_step')} ✓", COLORS["completed"]
    else:
        text = (f"RESUME MISSED: started at step {resume.get('start_step')}, the checkpoint holds step "
                f"{resume.get('checkpoint_step')} ({resume.get('steps_redone')} steps redone)")
        color = COLORS["deadline"]
    width = text_width(text, 10)
    left = x + 5 if x + 5 + width <= WIDTH - 4 else max(LEFT + 2, x - 5 - width)
    c.add(f'<g class="resume" data-start-step="{_esc(str(resume.get("start_step")))}" '
          f'data-from-checkpoint="{str(bool(resume["from_checkpoint"])).lower()}">'
          f'<title>{_esc(text)}</title>'
          f'<line x1="{x:.1f}" y1="{y0 + 4:.1f}" x2="{x:.1f}" y2="{y1 - 4:.1f}" stroke="{color}" '
          f'stroke-width="2.5"/>'
          + _text(left, (y0 + y1) / 2 + 4, text, size=10, fill=color, weight="bold", cls="resume-label")
          + "</g>")


def _at_risk(c: Canvas) -> None:
    """Under the training band: the span whose work a stop would lose (report's work at risk)."""
    risk = c.facts.run.work_at_risk
    if not isinstance(risk.get("since"), str) or not isinstance(risk.get("until"), str):
        return
    begin, end = iso_epoch(risk["since"]), iso_epoch(risk["until"])
    _, y1 = c.lanes["training"]
    x0, x1 = c.x(begin), c.x(end)
    text = f"at risk {_dur(risk.get('seconds'))}"
    label = _text(x1 - 2, y1 - 1, text, anchor="end", size=9, fill=COLORS["deadline"], cls="at-risk-label") \
        if x1 - x0 > len(text) * 5.5 else ""
    c.add(f'<g class="at-risk"><title>work at risk {_dur(risk.get("seconds"))}: from '
          f'{_esc(str(risk.get("since_what")))} to {_esc(str(risk.get("until_what")))}</title>'
          f'<rect x="{x0:.1f}" y="{y1 - 9:.1f}" width="{max(x1 - x0, 2):.1f}" height="3" '
          f'fill="{COLORS["deadline"]}" opacity="0.7"/>{label}</g>')


def _step_labels(c: Canvas, steps: Sequence[tuple[float, float, int]], top: float) -> None:
    """Step numbers at a spacing that stays readable."""
    last_x = -1e9
    for begin, end, step in steps:
        x = c.x((begin + end) / 2)
        if x - last_x >= 70:
            c.add(_text(x, top - 1, f"step {step}", anchor="middle", size=9, fill=COLORS["muted"],
                        cls="step-label"))
            last_x = x


def _saves(c: Canvas) -> None:
    y0, y1 = c.lanes["saves"]
    bar_top, bar_bottom = y0 + 40, y0 + 58
    mid = (bar_top + bar_bottom) / 2
    label_rows, plan_rows = LabelRows(2), LabelRows(3)
    for save in c.facts.saves:
        xs = c.x(save.signal)
        title = _save_title(save)
        group = [f'<g class="save save-{_slug(save.outcome)}" data-kind="{_esc(save.kind)}" '
                 f'data-outcome="{_esc(save.outcome)}"><title>{_esc(title)}</title>']
        if save.first_planned is not None and save.planned is not None and \
                abs(save.first_planned - save.planned) > 0.5:
            # below the bars, one row per save: where this save was first planned, and the move
            xf, xp = c.x(save.first_planned), c.x(save.planned)
            y = bar_bottom + 9 + plan_rows.place(min(xf, xp), max(xf, xp)) * 8
            group.append(f'<line class="plan-moved" x1="{xf:.1f}" y1="{y:.1f}" x2="{xp:.1f}" '
                         f'y2="{y:.1f}" stroke="{COLORS["muted"]}" stroke-dasharray="2 3"/>')
            group.append(_diamond(xf, y, 3.5, "#ffffff", COLORS["muted"], "first-plan"))
            group.append(_diamond(xp, y, 2, COLORS["muted"], COLORS["muted"], "plan-moved-to"))
        if save.planned is not None:
            group.append(_diamond(c.x(save.planned), mid, 6, "#ffffff", COLORS["planned"], "planned"))
        end = save.completed or save.started or save.signal
        if save.started is not None:
            group.append(f'<line class="boundary-wait" x1="{xs:.1f}" y1="{mid:.1f}" '
                         f'x2="{c.x(save.started):.1f}" y2="{mid:.1f}" stroke="{COLORS["signal"]}" '
                         f'stroke-width="2"/>')
        write_end = save.completed if save.completed is not None else (c.facts.end if save.started else None)
        if save.started is not None and write_end is not None:
            x0, x1 = c.x(save.started), c.x(write_end)
            color = COLORS.get(save.outcome, COLORS["not acknowledged"])
            group.append(f'<rect class="write" x="{x0:.2f}" y="{bar_top:.1f}" width="{max(x1 - x0, 2):.2f}" '
                         f'height="{bar_bottom - bar_top:.1f}" fill="{color}" rx="2"/>')
            end = write_end
        group.append(_triangle(xs, bar_top - 2, COLORS["signal"], "signal-sent"))
        label = f"{save.kind}" + (f" · step {save.step}" if save.step is not None else "") + \
            (f" · {save.duration_s:.3g}s" if save.duration_s is not None else "") + \
            ("" if save.outcome == "completed" else f" · {save.outcome}")
        x_label = min(max((xs + c.x(end)) / 2, LEFT + len(label) * 3.2), WIDTH - RIGHT - len(label) * 3.2)
        row = label_rows.place(x_label - len(label) * 3.2, x_label + len(label) * 3.2)
        group.append(_text(x_label, y0 + 14 + row * 13, label, anchor="middle", size=11,
                           weight="bold" if save.outcome != "completed" else "normal", cls="save-label"))
        group.append("</g>")
        c.add("".join(group))
    for begin, end, step in c.facts.own_saves:
        c.add(f'<rect class="own-save" x="{c.x(begin):.2f}" y="{bar_top + 4:.1f}" '
              f'width="{max(c.x(end) - c.x(begin), 2):.2f}" height="{bar_bottom - bar_top - 8:.1f}" '
              f'fill="{COLORS["own save"]}"><title>trainer\'s own save, step {step}, done {_clock(end)}'
              f'</title></rect>')
    if not c.facts.saves and not c.facts.own_saves:
        c.add(_text((LEFT + WIDTH - RIGHT) / 2, (y0 + y1) / 2 + 4, "no save", anchor="middle",
                    fill=COLORS["muted"], cls="no-save"))


def _save_title(save: SaveMark) -> str:
    parts = [f"{save.kind} save ({save.reason}): {save.outcome}"]
    if save.planned is not None:
        parts.append(f"planned signal {_clock(save.planned, ms=True)}")
    parts.append(f"signal sent {_clock(save.signal, ms=True)}")
    if save.started is not None:
        parts.append(f"step {save.step} boundary after {save.started - save.signal:.3f}s")
    if save.duration_s is not None:
        parts.append(f"written in {save.duration_s:.3f}s")
    if save.remaining_s is not None:
        parts.append(f"{save.remaining_s:.3f}s before the deadline")
    return "; ".join(parts)


def text_width(text: str, size: float) -> float:
    """The width `text` takes at `size` px in DejaVu Sans (the font named first)."""
    return size * sum(_EM_WIDTHS.get(ch, 1.0) for ch in text)


def _layout_signal_labels(c: Canvas) -> list[SignalLabel]:
    """Where each label of the signals lane goes; two labels never overlap. Marks closer than a
    few pixels share one label. A label goes right of its mark or else left of it (or, with no
    room on either side, as near as fits inside the picture), in the first row where it overlaps
    no other label and crosses no other mark's line; else in the first row where it overlaps no
    label; else in a new row (the lane grows)."""
    marks = [*c.facts.signals, *((at, "warning", name, "") for at, name in c.facts.warnings)]
    rows = LabelRows(3)
    for at, _, _, _ in marks:
        rows.block(c.x(at))
    labels = []
    for cluster in _clusters(c, marks, 12.0):
        text = " · ".join(label for _, _, label, _ in cluster)
        x_first, x_last = c.x(cluster[0][0]), c.x(cluster[-1][0])
        width = text_width(text, SIGNAL_LABEL_SIZE)
        right = (x_last + 6, x_last + 6 + width)
        left = (x_first - 6 - width, x_first - 6)
        sides = [side for side in (right, left) if side[0] >= LEFT + 2 and side[1] <= WIDTH - 4]
        if not sides:  # too wide for either side: inside the picture, as near the mark as it fits
            start = min(max(LEFT + 2, x_first - width / 2), WIDTH - 4 - width)
            sides = [(start, start + width)]
        row, (start, end) = rows.place_apart(sides)
        labels.append(SignalLabel(cluster, text, row, start, end))
    return labels


def _signal_marks(c: Canvas) -> None:
    """Each signal and exit as a mark, and each warning, with the labels laid out by
    `_layout_signal_labels`."""
    y0, y1 = c.lanes["signals"]
    for label in c.signal_labels:
        cluster = label.marks
        shapes = [_signal_shape(c.x(at), y0, y1, kind) for at, kind, _, _ in cluster]
        color = COLORS.get(cluster[0][1], COLORS["stop"])
        text = _text(label.left, y0 + 14 + label.row * SIGNAL_ROW_PX, label.text, size=SIGNAL_LABEL_SIZE,
                     fill=color, cls="signal-label")
        # a halo of the lane's colour: a label that had to cross another mark's line stays legible
        text = text.replace("<text ", '<text stroke="#fafafa" stroke-width="3" paint-order="stroke" ', 1)
        titles = "; ".join(f"{text}{f' ({detail})' if detail else ''} at {_clock(at, ms=True)}"
                           for at, _, text, detail in cluster)
        kinds = " ".join(sorted({f"signal-{kind}" for _, kind, _, _ in cluster}))
        c.add(f'<g class="signal-mark {kinds}"><title>{_esc(titles)}</title>{"".join(shapes)}{text}</g>')


def _clusters(c: Canvas, marks: Sequence[tuple[float, str, str, str]],
              within_px: float) -> list[list[tuple[float, str, str, str]]]:
    clusters: list[list[tuple[float, str, str, str]]] = []
    for mark in sorted(marks):
        if clusters and c.x(mark[0]) - c.x(clusters[-1][0][0]) < within_px:
            clusters[-1].append(mark)
        else:
            clusters.append([mark])
    return clusters


def _signal_shape(x: float, y0: float, y1: float, kind: str) -> str:
    bottom = y1 - 6
    if kind == "warning":
        return _triangle(x, y1 - 14, COLORS["warning"], "warning-mark")
    if kind == "exit":
        return f'<circle cx="{x:.1f}" cy="{bottom - 4:.1f}" r="4" fill="{COLORS["stop"]}"/>'
    if kind == "kill":
        return (f'<path d="M{x - 5:.1f},{bottom - 9:.1f} L{x + 5:.1f},{bottom + 1:.1f} M{x - 5:.1f},'
                f'{bottom + 1:.1f} L{x + 5:.1f},{bottom - 9:.1f}" stroke="{COLORS["kill"]}" '
                f'stroke-width="2.5"/>')
    color = COLORS.get(kind, COLORS["stop"])
    return (f'<line x1="{x:.1f}" y1="{y0 + 4:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="{color}" '
            f'stroke-width="3"/>')


class LabelRows:
    """Rows of text labels: a label goes where it overlaps no other label (with a gap) and
    crosses no blocked x (a mark's line, which runs through every row)."""

    GAP = 6.0

    def __init__(self, rows: int) -> None:
        self.rows: list[list[tuple[float, float]]] = [[] for _ in range(rows)]
        self.blocked: list[float] = []

    def block(self, x: float) -> None:
        self.blocked.append(x)

    def clear_of_labels(self, row: int, left: float, right: float) -> bool:
        return all(right + self.GAP < a or left - self.GAP > b for a, b in self.rows[row])

    def fits(self, row: int, left: float, right: float) -> bool:
        return self.clear_of_labels(row, left, right) and \
            not any(left - 1 <= x <= right + 1 for x in self.blocked)

    def place_apart(self, spans: Sequence[tuple[float, float]]) -> tuple[int, tuple[float, float]]:
        """The first row and span (in the order given) that crosses neither a label nor a blocked
        x, else the first that only crosses blocked x, else a new row: never over another label."""
        rows = range(len(self.rows))
        chosen = next(((r, span) for r in rows for span in spans if self.fits(r, *span)), None) or \
            next(((r, span) for r in rows for span in spans if self.clear_of_labels(r, *span)), None)
        if chosen is None:
            self.rows.append([])
            chosen = (len(self.rows) - 1, spans[0])
        self.rows[chosen[0]].append(chosen[1])
        return chosen

    def place(self, left: float, right: float) -> int:
        """The first row it fits in (else the row with the fewest labels); taken from now on."""
        row, _ = self.place_first([(r, (left, right)) for r in range(len(self.rows))])
        return row

    def place_first(self, options: list[tuple[int, tuple[float, float]]]) -> tuple[int, tuple[float, float]]:
        """The first (row, span) option that fits, else the first option's span in the row with
        the fewest labels."""
        chosen = next(((row, span) for row, span in options if self.fits(row, *span)), None)
        if chosen is None:
            fewest = min(range(len(self.rows)), key=lambda i: len(self.rows[i]))
            chosen = (fewest, options[0][1])
        self.rows[chosen[0]].append(chosen[1])
        return chosen


def _deadlines(c: Canvas) -> None:
    """Each deadline value: a line across the lanes at its moment (solid red: the last one;
    dashed grey: replaced), and in the deadline lane a bar from when it was learned to it."""
    y0, y_end = c.lanes["deadline"][0], c.bottom - LANE_GAP
    rows = LabelRows(2)
    for i, mark in enumerate(c.facts.deadlines):
        current = mark.replaced_at is None
        color = COLORS["deadline"] if current else COLORS["superseded"]
        dash = "" if current else ' stroke-dasharray="6 4"'
        cls = "deadline" + ("" if current else " superseded")
        label = f"{'deadline' if current else 'was'} {_clock(mark.at)} ({mark.source})"
        on_scale = c._on_scale(mark.at)
        x = c.x(mark.at) if on_scale else float(WIDTH - RIGHT)
        if not on_scale:
            label += f" → {_dur(mark.at - c.facts.end)} after the end"
        width = len(label) * 6.3
        anchor_end = x + 5 + width > WIDTH - 4
        left = x - 5 - width if anchor_end else x + 5
        row = rows.place(left, left + width)
        known_y = y0 + 33 + min(i, 2) * 4
        detail = f"learned {_clock(mark.known_at)}" + (f", replaced {_clock(mark.replaced_at)}"
                                                       if mark.replaced_at is not None else "")
        parts = [f'<g class="{cls}{"" if on_scale else " off-scale"}" data-source="{_esc(mark.source)}">',
                 f"<title>{_esc(label)}; {_esc(detail)}</title>",
                 # from when it was learned to where it is: the deadline as known at each moment
                 f'<line class="known" x1="{c.x(mark.known_at):.1f}" y1="{known_y:.1f}" x2="{x:.1f}" '
                 f'y2="{known_y:.1f}" stroke="{color}" stroke-width="2"{dash}/>',
                 f'<circle cx="{c.x(mark.known_at):.1f}" cy="{known_y:.1f}" r="3" fill="{color}"/>']
        if i > 0:  # learned mid-run: say how far it moved, next to where it was learned
            moved = mark.at - c.facts.deadlines[i - 1].at
            text = f"moved {'+' if moved > 0 else '−'}{_dur(abs(moved))} ({mark.source})"
            parts.append(_text(c.x(mark.known_at) + 6, known_y + 12, text, size=9, fill=color,
                               cls="deadline-moved"))
        if on_scale:
            stroke = 2.5 if current else 1.5
            parts.append(f'<line class="deadline-line" x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" '
                         f'y2="{y_end:.1f}" stroke="{color}" stroke-width="{stroke}"{dash}/>')
        parts.append(_text(x - 5 if anchor_end else x + 5, y0 + 14 + row * 13, label,
                           anchor="end" if anchor_end else "start", size=11, fill=color,
                           weight="bold" if current else "normal", cls="deadline-label"))
        parts.append("</g>")
        c.add("".join(parts))
    if not c.facts.deadlines:
        c.add(_text((LEFT + WIDTH - RIGHT) / 2, y0 + 30, "no deadline known", anchor="middle",
                    fill=COLORS["muted"], cls="no-deadline"))


# ---------------------------------------------------------------------- the job across runs
JOB_ROW = 44
JOB_HEADER = 56


def job_of(runs: Sequence[Sequence[Event]]) -> tuple[list[RunReport], JobReport]:
    reports = [summarize(events) for events in runs]
    return reports, job_report(reports, runs)


def _job_picture(runs: Sequence[Sequence[Event]], top: float) -> tuple[str, float]:
    """The job on one wall-clock axis: a row per run (instance), its saves and uploads, the work
    it lost when it ended (red), how it ended, and where the next run resumed."""
    reports, job = job_of(runs)
    t0, t1 = iso_epoch(job.started_at), iso_epoch(job.ended_at)
    span = max(t1 - t0, 1.0)
    t1 += span * 0.02
    width = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + (min(max(t, t0), t1) - t0) / (t1 - t0) * width

    parts = [_text(16, top + 22, f"job: {len(job.runs)} runs, {job.reclamations} reclamations", size=16,
                   weight="bold", cls="job-title"),
             _text(16, top + 42, _short(f"lost {_dur(job.lost_s)} of training when runs ended "
                                        f"({job.lost_steps} steps), {job.steps_redone} steps redone after "
                                        f"resuming · saving {_dur(job.saving_s)} · uploading "
                                        f"{_dur(job.uploading_s)}", 180),
                   fill=COLORS["muted"], cls="job-subtitle")]
    y = top + JOB_HEADER
    for i, (report, row) in enumerate(zip(reports, job.runs, strict=True)):
        y0, y1 = y + i * JOB_ROW, y + i * JOB_ROW + JOB_ROW - 10
        start, end = iso_epoch(row.started_at), iso_epoch(row.ended_at)
        group = [f'<g class="job-run" data-run-id="{_esc(row.run_id)}" data-exit="{row.exit_code}">',
                 f"<title>{_esc(_job_row_title(row))}</title>",
                 _text(LEFT - 10, y0 + 14, f"run {row.run_id[:8]}", anchor="end", weight="bold",
                       cls="job-label"),
                 _text(LEFT - 10, y0 + 28, _short(row.instance or "?", 16), anchor="end", size=10,
                       fill=COLORS["muted"], cls="job-instance"),
                 f'<rect class="job-span" x="{x(start):.1f}" y="{y0 + 4:.1f}" '
                 f'width="{max(x(end) - x(start), 1):.1f}" height="{y1 - y0 - 8:.1f}" '
                 f'fill="{COLORS["training"]}"/>']
        for save in report.saves + [SimpleSave(t) for t in report.trainer_saves]:
            done = save.completed_at if isinstance(save.completed_at, str) else None
            if done is None:
                continue
            end_at = iso_epoch(done)
            begin = end_at - (save.duration_s if isinstance(save.duration_s, (int, float)) else 0.0)
            group.append(f'<rect class="job-save" x="{x(begin):.2f}" y="{y0 + 4:.1f}" '
                         f'width="{max(x(end_at) - x(begin), 2):.2f}" height="{(y1 - y0 - 8) / 2:.1f}" '
                         f'fill="{COLORS["completed"]}"/>')
        for upload in report.uploads:
            end_at = iso_epoch(upload["at"])
            raw = upload.get("duration_s")
            began = end_at - (float(raw) if isinstance(raw, (int, float)) else 0.0)
            color = COLORS["upload"] if upload["outcome"] == "completed" else COLORS["failed"]
            group.append(f'<rect class="job-upload upload-{upload["outcome"]}" x="{x(began):.2f}" '
                         f'y="{y0 + 4 + (y1 - y0 - 8) / 2:.1f}" width="{max(x(end_at) - x(began), 2):.2f}" '
                         f'height="{(y1 - y0 - 8) / 2:.1f}" fill="{color}"/>')
        risk = report.work_at_risk
        if isinstance(risk.get("since"), str) and isinstance(risk.get("until"), str) and row.lost_s > 0:
            a, b = iso_epoch(risk["since"]), min(iso_epoch(risk["until"]), end)
            left = min(x(a), x(b) - 2)  # at least 2 px, ending where the run ends
            group.append(f'<rect class="job-lost" x="{left:.2f}" y="{y1 - 5:.1f}" '
                         f'width="{x(b) - left:.2f}" height="4" fill="{COLORS["deadline"]}"/>')
        ending = f"exit {row.exit_code}" if row.exit_code is not None else "log stops"
        group.append(_text(min(x(end) + 4, WIDTH - 4), y0 + 18, ending, anchor="start" if x(end) + 60 < WIDTH
                           else "end", size=11, weight="bold", cls="job-exit"))
        if row.start_step is not None:
            resumed = f"from step {row.start_step}"
            group.append(_text(x(start) + 3, y0 - 0.5, resumed, size=9, fill=COLORS["muted"],
                               cls="job-resume"))
        group.append("</g>")
        parts.append("".join(group))
    height = JOB_HEADER + len(job.runs) * JOB_ROW + 24
    ticks, step = [], _tick_step(t1 - t0)
    k = 0
    while t0 + k * step <= t1:
        tx = x(t0 + k * step)
        ticks.append(_text(tx, top + height - 6, _clock(t0 + k * step), anchor="middle", size=10,
                           fill=COLORS["muted"], cls="job-tick"))
        k += 1
    return f'<g class="job">{"".join(parts)}{"".join(ticks)}</g>', height


class SimpleSave:
    """A trainer's own save as the job picture draws it."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.completed_at = fields.get("at")
        self.duration_s = fields.get("duration_s")


def _job_row_title(row: Any) -> str:
    text = (f"run {row.run_id} on {row.instance or '?'}: {row.started_at} → {row.ended_at}; deadline from "
            f"{row.deadline_source or 'none'}; exit {row.exit_code} ({row.exit_meaning or 'log stops'})")
    if row.checkpoint_step is not None:
        text += f"; durable checkpoint step {row.checkpoint_step}"
    text += f"; lost {row.lost_s:g}s"
    if row.steps_redone:
        text += f" + {row.steps_redone} steps redone by the next run"
    return text


def _or_unknown(value: int | None) -> str:
    return "?" if value is None else str(value)


def _job_table(job: JobReport) -> str:
    head = ("run", "instance", "deadline from", "exit", "steps", "durable checkpoint", "lost when it ended",
            "redone by the next run", "saving", "uploading")
    rows = []
    for r in job.runs:
        cells = (r.run_id, r.instance or "?", r.deadline_source or "none",
                 f"{r.exit_code}" if r.exit_code is not None else "log stops",
                 f"{_or_unknown(r.start_step)}→{_or_unknown(r.last_step)}",
                 "none" if r.checkpoint_step is None else f"step {r.checkpoint_step}",
                 f"{_dur(r.lost_s)}" + (f" ({r.lost_steps} steps)" if r.lost_steps is not None else ""),
                 f"{r.steps_redone} steps", _dur(r.saving_s), _dur(r.uploading_s))
        rows.append("<tr>" + "".join(f"<td>{_esc(str(c))}</td>" for c in cells) + "</tr>")
    total = ("total", "", "", f"{job.reclamations} reclamations", "", "",
             f"{_dur(job.lost_s)} ({job.lost_steps} steps)", f"{job.steps_redone} steps", _dur(job.saving_s),
             _dur(job.uploading_s))
    rows.append('<tr class="total">' + "".join(f"<th>{_esc(str(c))}</th>" for c in total) + "</tr>")
    header = "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + "</tr>"
    return f'<table class="job-table">{header}{"".join(rows)}</table>'


# ---------------------------------------------------------------------- small pieces
def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 12, fill: str | None = None,
          weight: str = "normal", cls: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    return (f'<text{attrs} x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
            f'font-weight="{weight}" fill="{fill or COLORS["text"]}">{_esc(text)}</text>')


def _diamond(x: float, y: float, r: float, fill: str, stroke: str, cls: str) -> str:
    return (f'<path class="{cls}" d="M{x:.1f},{y - r:.1f} L{x + r:.1f},{y:.1f} L{x:.1f},{y + r:.1f} '
            f'L{x - r:.1f},{y:.1f} Z" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>')


def _triangle(x: float, y: float, fill: str, cls: str, down: bool = True) -> str:
    tip = y + 9 if down else y - 9
    return (f'<path class="{cls}" d="M{x - 6:.1f},{y:.1f} L{x + 6:.1f},{y:.1f} L{x:.1f},{tip:.1f} Z" '
            f'fill="{fill}"/>')


def _tick_step(span: float) -> float:
    for step in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                 86400):
        if span / step <= 10:
            return float(step)
    return 86400.0 * math.ceil(span / 86400 / 10)


def _dur(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "?"
    s = float(seconds)
    if abs(s) < 60:
        return f"{s:.3g}s" if s != int(s) else f"{int(s)}s"
    if abs(s) < 3600:
        m, sec = divmod(round(s), 60)
        return f"{m}m{sec:02d}s" if sec else f"{m}m"
    h, rest = divmod(round(s), 3600)
    return f"{h}h{rest // 60:02d}m"


def _clock(epoch_s: float, ms: bool = False) -> str:
    """The UTC time of day of the ISO form: 02:15:11, or 02:15:11.123 with `ms`."""
    stamp = iso_utc(epoch_s, "milliseconds" if ms else "seconds")
    return stamp[11:-1] if stamp.endswith("Z") else stamp  # no calendar date: `epoch <value>`


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _slug(text: str) -> str:
    return text.replace(" ", "-")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------- the page
LEGEND = (
    ("deadline", "deadline (solid: the last one; dashed grey: a value it replaced)"),
    ("signal", "save signal sent ▼, then the wait for the step boundary"),
    ("planned", "◇ planned signal moment (below, dotted: from the first plan, when it moved)"),
    ("completed", "save written and acknowledged"),
    ("failed", "save failed or missed"),
    ("not acknowledged", "save not acknowledged before the end"),
    ("step_b", "training steps (alternating shades)"),
    ("stop", "stop signal; ● exits"),
    ("upload", "upload completed (--upload; red: failed)"),
)


def render_html(runs: Sequence[Sequence[Event]], skipped: int, source: str) -> str:
    """A self-contained page: per run the picture, the key figures and the text report; with
    several runs, the job across them first."""
    sections = []
    if len(runs) > 1:
        _, job = job_of(runs)
        picture, height = _job_picture(runs, 0.0)
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
               f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="{FONT}" font-size="12" role="img" '
               f'aria-label="esiwrap job across runs"><rect width="100%" height="100%" fill="#ffffff"/>'
               f"{picture}</svg>")
        sections.append(f'<section class="job" id="job"><h2>the job: {len(runs)} runs</h2>{svg}'
                        f"{_job_table(job)}<details><summary>esiwrap report (text)</summary>"
                        f"<pre>{_esc(render_job(job))}</pre></details></section>")
    for events in runs:
        svg = render_svg([events])
        report = summarize(events)
        sections.append(
            f'<section class="run" id="run-{_esc(report.run_id)}">'
            f"<h2>run {_esc(report.run_id)}</h2>{svg}{_figures(report)}"
            f"<details><summary>esiwrap report (text)</summary><pre>{_esc(render_text([report], skipped))}"
            f"</pre></details></section>")
    legend = "".join(f'<li><span class="swatch" style="background:{COLORS[key]}"></span>{_esc(text)}</li>'
                     for key, text in LEGEND)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>esiwrap timeline: {_esc(source)}</title>
<style>
body {{ font-family: {FONT}; margin: 24px; color: #222; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }} h2 {{ font-size: 16px; margin: 28px 0 8px; }}
.source {{ color: #666; margin: 0 0 12px; }}
svg {{ max-width: 100%; height: auto; border: 1px solid #e6e6e6; }}
ul.legend {{ list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 6px 18px; font-size: 13px; }}
.swatch {{ display: inline-block; width: 12px; height: 12px; margin-right: 6px; vertical-align: -1px; }}
table.figures {{ border-collapse: collapse; margin: 10px 0; font-size: 13px; }}
table.figures th {{ text-align: left; padding: 3px 12px 3px 0; color: #666; font-weight: normal; }}
table.figures td {{ padding: 3px 12px 3px 0; }}
table.job-table {{ border-collapse: collapse; margin: 10px 0; font-size: 13px; }}
table.job-table th, table.job-table td {{ text-align: left; padding: 3px 10px;
  border-bottom: 1px solid #e6e6e6; }}
pre {{ font-size: 12px; background: #f6f6f6; padding: 10px; overflow-x: auto; }}
</style></head>
<body><h1>esiwrap timeline</h1>
<p class="source">{_esc(source)} · {len(runs)} run{"" if len(runs) == 1 else "s"}
· {skipped} other line{"" if skipped == 1 else "s"} skipped · times in UTC</p>
<ul class="legend">{legend}</ul>
{"".join(sections)}
</body></html>
"""


def _figures(run: RunReport) -> str:
    rows: list[tuple[str, str]] = []
    if run.deadline is not None:
        moved = f"; moved {len(run.deadline_changes)}×" if run.deadline_changes else ""
        final = run.deadline_changes[-1] if run.deadline_changes else None
        at = final["new"] if final else run.deadline.get("at")
        source = final["source"] if final else run.deadline.get("source")
        rows.append(("deadline", f"{at} from {source}{moved}"))
    else:
        rows.append(("deadline", "none known"))
    for s in run.saves:
        text = f"{s.kind}: {s.outcome}"
        if s.step is not None:
            text += f", step {s.step}"
        if s.duration_s is not None:
            text += f", written in {s.duration_s:g}s"
        if s.remaining_s is not None:
            text += f", {s.remaining_s:g}s before the deadline"
        rows.append(("save", text))
    risk = run.work_at_risk
    span = f"{risk.get('since_what')} → {risk.get('until_what')}"
    rows.append(("work at risk", f"{_dur(risk.get('seconds'))} ({span})"))
    if run.exit_code is not None:
        rows.append(("exit", f"{run.exit_code}: {run.exit_meaning}"))
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="figures">{body}</table>'
