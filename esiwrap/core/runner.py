"""The one order every world drives the decision core in: every waiting input, then the due timers, once.

The supervisor (real processes), the simulator (a simulated clock: `esiwrap.tools.replay`,
`benchmarks/`, `esiwrap report --what-if`) and the tests' driver are adapters of one `Runner`: each
gives it the controller, its clock and its `Effects`, and tells it what happened. None decides an
order of its own:

    runner.feed(input)   something happened: it, and the inputs that follow from its actions,
                         are applied now; the timers wait
    runner.wake(late_s)  the loop woke up and fed what was waiting: the timers that fell due fire,
                         once, and what follows from their actions is applied
    runner.finish()      the world is leaving: what must still be carried out
    runner.wake_in()     seconds until a timer is due (None: none)

Why this order: a loop held up (a starved node, a stalled disk) can find a trainer's step report,
save_begin and save_end waiting together past the deadline. Applied one by one with the timers
firing after each, the deadline's timer fired between the step report and the save_end, and a
save acknowledged in time counted as missed (exit 76). Every input that was waiting when the loop
woke is applied before a timer that fell due meanwhile decides.

An input fed while actions are being carried out (an effect's consequence: an upload started, the
tree checked) waits until those actions are done, then is applied in order; nothing is applied
inside another input's actions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from esiwrap.core.controller import Action, Controller, Input, Now
from esiwrap.core.effects import Effects, carry_out


class Runner:
    """Drives one controller in production's order, carrying out its actions through `effects`;
    `now` is the world's clock (the wall clock for deadlines, the monotonic clock for waits)."""

    def __init__(self, controller: Controller, effects: Effects, now: Callable[[], Now]) -> None:
        self.controller = controller
        self._effects = effects
        self._now = now
        self._waiting: deque[Input] = deque()
        self._busy = False  # carrying out actions: what is fed now waits its turn

    def feed(self, input_: Input) -> None:
        """Something happened: apply it and what follows from it, unless actions are being carried
        out (then it follows them)."""
        self._waiting.append(input_)
        self._carry_out(())

    def wake(self, late_s: float | None = None) -> None:
        """The loop woke (a timer, or an input it has fed): fire the due timers once and apply what
        follows. `late_s`: how late the loop ran against the wake-up it asked for, when it slept
        until then (plans keep it as margin)."""
        self._carry_out(self.controller.tick(self._now(), late_s))

    def finish(self) -> None:
        """The world is leaving (after `Exit`, or on a failure of its own)."""
        self._carry_out(self.controller.finish(self._now()))

    def wake_in(self) -> float | None:
        """Seconds until a timer is due (0: due now), or None when none is."""
        return self.controller.wake_at(self._now())

    def _carry_out(self, actions: Iterable[Action]) -> None:
        if self._busy:
            if list(actions):  # a timer fired from inside an action: the world's bug
                msg = "the runner was woken while it carried out actions"
                raise RuntimeError(msg)
            return
        self._busy = True
        try:
            for action in actions:
                carry_out(self._effects, action)
            while self._waiting:
                for action in self.controller.handle(self._waiting.popleft(), self._now()):
                    carry_out(self._effects, action)
        finally:
            self._busy = False
