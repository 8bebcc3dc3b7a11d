"""The storage probe: how fast the checkpoint's storage takes writes, asked of the shell until a
save is measured (a measured save is the better figure)."""

from __future__ import annotations

from esiwrap import events as ev
from esiwrap.core.controller.modes import Mode
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import PROBE_REPEAT_S, Now, ProbeStorage, StorageProbed
from esiwrap.core.controller.timers import Timer
from esiwrap.core.policy import Observations
from esiwrap.core.values import Deadline

UNKNOWN_SIZE_PROBE_BYTES = 64 << 20  # the probe's bound while the checkpoint's size is unknown


class StorageProbe:
    def __init__(self, out: Outbox, obs: Observations, enabled: bool, probe_dir: str | None) -> None:
        self._out = out
        self._obs = obs
        self._enabled = enabled  # --probe-storage
        self._probe_dir = probe_dir  # where to probe when no trainer names its checkpoint directory
        self._asked = False  # the probe was asked for (once; then every PROBE_REPEAT_S)
        self._again_at: float | None = None  # wall time of the next probe, while nothing is measured

    def ask(self, checkpoint_dir: str | None, previous: str | None = None) -> None:
        """Ask the shell to measure the storage once a directory is known, and the checkpoint a
        trainer resumed from; only until a save is measured."""
        if not self._enabled or self._obs.measured:
            return
        path = None if self._asked else (checkpoint_dir or self._probe_dir)
        if path is None and previous is None:
            return
        if path is not None:
            self._asked = True
            self._obs.probe_begun()  # no calibration save on a guess while the prior is coming
        self._out.act(ProbeStorage(path, previous, self._max_bytes()))

    def _max_bytes(self) -> int:
        """A probe never writes more than a checkpoint would (a small one is a second's write), and
        while nobody said how big one is, `UNKNOWN_SIZE_PROBE_BYTES`: enough to measure a disk or a
        network mount, not a gigabyte beside a checkpoint of kilobytes."""
        size = self._obs.checkpoint_bytes
        return UNKNOWN_SIZE_PROBE_BYTES if size is None else int(size)

    def again(self, checkpoint_dir: str | None) -> None:
        """Storage speed changes (other jobs, a filling disk): measure again, rarely."""
        self._again_at = None
        path = checkpoint_dir or self._probe_dir
        if path is not None and not self._obs.measured:
            self._out.act(ProbeStorage(path, None, self._max_bytes()))

    def probed(self, probed: StorageProbed, now: Now) -> None:
        """What the shell measured becomes the prior's bandwidth (the slower of two rules)."""
        obs = self._obs
        if probed.source == "probe":
            obs.probe_ended()
            self._again_at = now.wall + PROBE_REPEAT_S
        if probed.source == "previous checkpoint" and probed.written_bytes > 0:
            obs.checkpoint_size_if_unknown(probed.written_bytes)  # the trainer did not say: its last one does
        if probed.bandwidth_bps is None or not probed.bandwidth_bps > 0:
            self._out.log("warning", ev.STORAGE_PROBED, path=probed.path, source=probed.source,
                          error=probed.error)
            return
        obs.storage_measured(probed.bandwidth_bps, probed.source)
        self._out.log("info", ev.STORAGE_PROBED, path=probed.path, source=probed.source,
                      bandwidth_mb_s=rounded(probed.bandwidth_bps / 1e6),
                      written_bytes=int(probed.written_bytes), seconds=rounded(probed.seconds))

    def timers(self, mode: Mode, deadline: Deadline | None) -> list[Timer]:
        if mode is Mode.RUNNING and deadline is not None and self._again_at is not None \
                and not self._obs.measured:
            return [Timer("storage probe", "wall", self._again_at)]
        return []
