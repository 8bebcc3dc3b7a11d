"""The real supervisor with a deadline source the test can move: a file it re-reads.

    python tests/lib/changing_deadline.py DEADLINE_FILE LOG_FILE -- COMMAND...

The file holds epoch seconds; the source asks again every 0.3 s, so rewriting the file is what a
cloud API announcing a new release time looks like to esiwrap (`deadline_changed`). The core's
own sources (flag, environment) cannot change during a run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from esiwrap.core.controller import ControllerConfig
from esiwrap.core.policy import PolicyConfig
from esiwrap.core.values import Deadline
from esiwrap.errors import SourceUnavailable
from esiwrap.shell import log
from esiwrap.shell.supervisor import Supervisor, SupervisorConfig


@dataclass
class FileSource:
    path: Path
    name: str = "file"

    @property
    def period_s(self) -> float | None:
        return 0.3

    def resolve(self, now: float) -> Deadline:
        try:
            text = self.path.read_text().strip()
            return Deadline(at=float(text), source=self.name, raw=text)
        except (OSError, ValueError) as exc:
            raise SourceUnavailable(str(exc)) from None


def main(argv: list[str]) -> int:
    deadline_file, log_file, separator, *command = argv
    assert separator == "--", "usage: changing_deadline.py DEADLINE_FILE LOG_FILE -- COMMAND..."
    run_id = log.new_run_id()
    log.configure(run_id, log_file=log_file)
    policy = PolicyConfig(redundant_s=4.0, save_duration_s=1.0, final_margin_s=2.0)
    config = SupervisorConfig(argv=command, controller=ControllerConfig(policy=policy, stop_grace_s=10.0),
                              run_id=run_id)
    return Supervisor(config, [FileSource(Path(deadline_file))]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
