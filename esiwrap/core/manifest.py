"""A checkpoint's manifest: what the next instance needs when only an object store outlives this one.

With `--upload`, esiwrap writes a small JSON file beside each verified checkpoint before its upload
(`{manifest}` in the upload command, `ESIWRAP_MANIFEST` in its environment). The upload command
copies it last, after the checkpoint: a manifest in the store means its checkpoint is all there.
A new instance with no state file runs `--restore-manifests` to copy the job's manifests back,
takes the newest complete one (`newest`), and from it knows which step to restore, where the
trainer expects it, and the job's state (its measurements, its history, its durable checkpoint):
the state file comes back too.

    {"format": "esiwrap-manifest/1",
     "step": 1200, "path": "/ckpt/global_step_1200", "name": "global_step_1200",
     "bytes": 5368709120, "files": 12, "verified": "verl",
     "written_at": 1796008850.3, "written": "2026-12-01T12:00:50Z",
     "run_id": "r-7f3a", "host": "ip-10-0-0-12",
     "state": {"format": "esiwrap-state/1", ...},
     "checksum": "sha256:9c1f..."}

`checksum` is the SHA-256 of the manifest without its `checksum` member, as JSON with sorted keys
and no spaces (`json.dumps(obj, sort_keys=True, separators=(",", ":"))`, UTF-8): a manifest cut
short, edited or mixed up with another file does not pass. `state` is the job's state file as it
will be once this checkpoint's upload completed (`esiwrap.core.state`, `checkpoint` naming this
one, durable by its upload). Everything here is pure: the shell reads and writes the files.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, NamedTuple

from esiwrap.core.state import JobState, StateIgnored
from esiwrap.core.state import parse as parse_state
from esiwrap.core.state import render as render_state
from esiwrap.core.values import finite_number
from esiwrap.times import iso_utc

FORMAT = "esiwrap-manifest/1"
MAX_BYTES = 4 << 20  # a manifest is a few KiB; its state's history is bounded


class Manifest(NamedTuple):
    """One complete manifest: the checkpoint of `step` at `path`, uploaded by the run `run_id`."""

    step: int
    path: str
    written_at: float
    run_id: str = ""
    bytes: int = 0
    files: int = 0
    verified: str = ""  # the format its verification found ("" when nothing verified it)
    state: JobState | None = None  # the job's state as it was when the checkpoint was uploaded
    source: str = ""  # the file it was read from (for the log)


class ManifestRejected(Exception):
    """A file that is not a complete manifest; the message says why."""


def checksum(obj: dict[str, Any]) -> str:
    """The manifest's checksum: SHA-256 of its members but `checksum`, sorted, without spaces."""
    import hashlib  # only where a manifest is written or read: not at esiwrap's start

    body = {key: value for key, value in obj.items() if key != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def render(step: int, path: str, written_at: float, *, run_id: str = "", host: str = "", bytes_: int = 0,
           files: int = 0, verified: str = "", state: JobState | None = None) -> str:
    """The manifest's text, its checksum last."""
    obj: dict[str, Any] = {
        "format": FORMAT, "step": step, "path": path, "name": posixpath.basename(path.rstrip("/")),
        "bytes": bytes_, "files": files, "verified": verified or None,
        "written_at": round(written_at, 3), "written": iso_utc(written_at), "run_id": run_id, "host": host,
    }
    if state is not None:
        obj["state"] = json.loads(render_state(state))
    obj["checksum"] = checksum(obj)
    return json.dumps(obj, indent=1) + "\n"


def parse(text: str, now: float, source: str = "") -> Manifest:
    """The manifest in `text`, or ManifestRejected with the reason. Its state is read as a state
    file would be; a state that cannot be used (too old, say) leaves the manifest without one."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        msg = f"not JSON ({exc}): cut short?"
        raise ManifestRejected(msg) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        msg = f"not an esiwrap manifest (expected format {FORMAT!r})"
        raise ManifestRejected(msg)
    if obj.get("checksum") != checksum(obj):
        msg = "its checksum does not match its contents: cut short or changed"
        raise ManifestRejected(msg)
    step, path, at = obj.get("step"), obj.get("path"), obj.get("written_at")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(path, str) \
            or not finite_number(at):
        msg = "no step, path or time"
        raise ManifestRejected(msg)
    state = None
    if isinstance(obj.get("state"), dict):
        try:
            state = parse_state(json.dumps(obj["state"]), now)
        except StateIgnored:
            state = None
    return Manifest(step, path, float(at), _text(obj.get("run_id")), _count(obj.get("bytes")),
                    _count(obj.get("files")), _text(obj.get("verified")), state, source)


def newest(manifests: list[Manifest] | tuple[Manifest, ...]) -> Manifest | None:
    """The manifest to restore from: the highest step, the newest written of those."""
    return max(manifests, key=lambda m: (m.step, m.written_at), default=None)


def file_name(checkpoint_path: str) -> str:
    """The manifest's file name beside the checkpoint at `checkpoint_path`: `esiwrap-manifest.` and
    the checkpoint's own name (a prefix, so that no trainer's `global_step_*` or `checkpoint-*`
    pattern takes it for a checkpoint)."""
    name = posixpath.basename(checkpoint_path.rstrip("/")) or "checkpoint"
    return f"esiwrap-manifest.{name}.json"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
