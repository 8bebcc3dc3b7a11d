"""The deadline book: what every source said, the deadline that rules, the capacity's kind."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from esiwrap import events as ev
from esiwrap.choices import LogLevel
from esiwrap.core.controller.modes import Mode
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import DEADLINE_CHANGE_S, Now
from esiwrap.core.controller.timers import Timer
from esiwrap.core.policy import Capacity
from esiwrap.core.values import NODE_PREFIX, Answer, CapacityKind, Deadline, winner

OVERSTAY_S = 60.0  # still here this long past the deadline: the sources are asked again


class AnswerNews(NamedTuple):
    """What one answer changed that the controller acts on."""

    cancelled: bool = False  # the ruling deadline's own source took it back
    early_warning: str = ""  # a new early warning from its source ("" when none is new)


class DeadlineBook:
    """Every source's last answer; the deadline that rules is the winner of the ones known."""

    def __init__(self, out: Outbox) -> None:
        self._out = out
        self.deadline: Deadline | None = None
        self.pending = True  # no deadline answer handed over yet
        self._known: dict[str, Deadline] = {}
        self._unavailable: dict[str, str] = {}
        self._early_warnings: dict[str, str] = {}  # source -> the early warning it gives now
        self._capacities: dict[str, CapacityKind] = {}  # source -> the capacity kind it reported
        self._notices: dict[str, float] = {}  # source -> the notice it watches for now (spot)
        self._node_sources: set[str] = set()  # other Ray nodes' sources that answered (node:<id>/…)
        self._overstay_asked: float | None = None  # the deadline the sources were asked again about
        self.recheck_pending = False  # the next answers are logged whatever they say

    def overstayed(self, now: Now) -> None:
        """Still here OVERSTAY_S past the ruling deadline: say so, once for this deadline; the
        sources are asked again (the controller acts) and what they say next is logged."""
        deadline = self.deadline
        assert deadline is not None
        self._overstay_asked, self.recheck_pending = deadline.at, True
        self._out.log("warning", ev.DEADLINE_OVERSTAYED, deadline=deadline.iso(), source=deadline.source,
                      overstay_s=rounded(now.wall - deadline.at),
                      action="asking the sources again: the deadline they gave may be wrong")

    def rechecked(self, answers: Iterable[Answer]) -> None:
        """What the sources said when asked again after an overstay."""
        self.recheck_pending = False
        said = [{"source": a.source, "deadline": a.deadline.iso() if a.deadline else None,
                 "reason": a.reason or None} for a in answers]
        self._out.log("info", ev.DEADLINE_RECHECKED, answers=said)

    def take(self, answers: Iterable[Answer]) -> Iterator[tuple[Answer, AnswerNews]]:
        """Note each source's answer (log what a person should know of it), and yield what it
        changed as it is noted: the controller acts on one before the next is noted."""
        self.pending = False
        for answer in answers:
            yield answer, self._take_one(answer)

    def _take_one(self, answer: Answer) -> AnswerNews:
        if answer.capacity is not None:
            self._capacities[answer.source] = answer.capacity
        if answer.notice_s is not None:
            self._notices[answer.source] = answer.notice_s
        else:
            self._notices.pop(answer.source, None)  # it cannot see a notice now (unreachable)
        if answer.source.startswith(NODE_PREFIX):
            self._node_sources.add(answer.source)
        cancelled = False
        if answer.withdrawn:  # a node that left, an event cancelled: its deadline no longer counts
            self._capacities.pop(answer.source, None)
            self._node_sources.discard(answer.source)
            known = self._known.pop(answer.source, None)
            if known is not None or self._unavailable.pop(answer.source, None) is not None:
                self._out.log("info", ev.DEADLINE_WITHDRAWN, source=answer.source, reason=answer.reason)
            cancelled = self._took_back_the_ruling_deadline(answer, known)
        elif answer.deadline is not None:
            self._known[answer.source] = answer.deadline
            self._unavailable.pop(answer.source, None)
        elif self._unavailable.get(answer.source) != answer.reason:
            self._unavailable[answer.source] = answer.reason
            level: LogLevel = "info" if answer.expected else "warning"
            self._out.log(level, ev.DEADLINE_UNAVAILABLE, source=answer.source, reason=answer.reason)
        return AnswerNews(cancelled, self._new_early_warning(answer))

    def _took_back_the_ruling_deadline(self, answer: Answer, known: Deadline | None) -> bool:
        """The ruling deadline's own source withdrew it (an Azure event cancelled). A node that
        left the cluster is no such news: its last deadline is kept (docs: Several nodes)."""
        ruling = self.deadline
        return known is not None and ruling is not None and known.source == ruling.source \
            and not answer.source.startswith(NODE_PREFIX)

    def _new_early_warning(self, answer: Answer) -> str:
        """An early warning (EC2 rebalance) counts once per warning: "" unless it is new."""
        if answer.early_warning == self._early_warnings.get(answer.source, ""):
            return ""
        if not answer.early_warning:
            del self._early_warnings[answer.source]
            return ""
        self._early_warnings[answer.source] = answer.early_warning
        return answer.early_warning

    def ruling(self) -> Deadline | None:
        """The deadline the known answers give now (the earliest, by `winner`)."""
        return winner(Answer(d.source, deadline=d) for d in self._known.values())

    def capacity(self, trainer_nodes: int) -> Capacity:
        """The capacity the policy plans for: spot if any source says so (the first reclamation
        counts), else reserved or on-demand; the job's nodes: every Ray node watched, or what a
        trainer said (torchrun's world)."""
        kinds = self._capacities
        order: tuple[CapacityKind, ...] = ("spot", "reserved", "on-demand")
        kind = next((k for k in order if k in kinds.values()), None)
        source = next((s for s, k in kinds.items() if k == kind), "")
        watched = len({source.split("/", 1)[0] for source in self._node_sources})
        nodes = max(trainer_nodes, 1 + watched)
        return Capacity(kind, nodes, source, self._notice_on_every_node(nodes))

    def _notice_on_every_node(self, nodes: int) -> float | None:
        """The warning the job can count on: the shortest of its nodes' notices (a node's is the
        longest its sources watch for), or None unless a source watches on every node."""
        by_node: dict[str, float] = {}
        for source, notice in self._notices.items():
            node = source.split("/", 1)[0] if source.startswith(NODE_PREFIX) else ""
            by_node[node] = max(notice, by_node.get(node, notice))
        return min(by_node.values()) if by_node and len(by_node) >= nodes else None

    def adopt(self, new: Deadline, now: Now, capacity: Capacity) -> tuple[bool, Deadline | None]:
        """Make `new` the ruling deadline, unless it is the same one said twice: (adopted, the old one)."""
        old = self.deadline
        if old is not None and abs(old.at - new.at) < DEADLINE_CHANGE_S:
            return False, old
        self.deadline = new
        # the notice watched, when one is: `esiwrap report --what-if` replays the run with it
        notice = {} if capacity.notice_s is None else {"notice_s": capacity.notice_s}
        if old is None:
            self._out.log("info", ev.DEADLINE_RESOLVED, source=new.source, deadline=new.iso(),
                          remaining_s=rounded(new.at - now.wall), raw=new.raw, lead_s=new.lead_s,
                          capacity=capacity.kind, **notice, **new.detail)
        else:
            self._out.log("warning", ev.DEADLINE_CHANGED, old=old.iso(), new=new.iso(), source=new.source,
                          remaining_s=rounded(new.at - now.wall), raw=new.raw, capacity=capacity.kind,
                          **notice, **new.detail)
        return True, old

    def forget(self) -> None:
        """No deadline any more (the announced event was cancelled, or is over)."""
        self.deadline = None

    def view(self) -> dict[str, Any]:
        deadline = self.deadline
        return {"deadline_at": deadline.at if deadline else None,
                "deadline_source": deadline.source if deadline else None, "deadline_pending": self.pending}

    def remaining_s(self, now: Now) -> float | None:
        return rounded(self.deadline.at - now.wall) if self.deadline is not None else None

    def timers(self, mode: Mode) -> list[Timer]:
        deadline = self.deadline
        if deadline is None or mode is Mode.EXITED:
            return []
        timers = []
        if mode in (Mode.RUNNING, Mode.SAVE_REQUESTED):
            timers.append(Timer("deadline", "wall", deadline.at))
        if self._overstay_asked != deadline.at:
            timers.append(Timer("overstay", "wall", deadline.at + OVERSTAY_S))
        return timers
