"""Running under systemd: sd_notify for the supervisor, and the unit that runs a job.

`notify` and `status` are what the supervisor uses at run time (standard library only); `unit`
renders and installs `esiwrap@.service` (shipped here as package data) and a job's environment
file for `esiwrap systemd-unit`.
"""

from __future__ import annotations

from esiwrap.shell.systemd.notify import CHILD_UNSET, Notifier
from esiwrap.shell.systemd.status_line import human_duration, status_parts

__all__ = ["CHILD_UNSET", "Notifier", "human_duration", "status_parts"]
