"""Is a checkpoint whole? Checked from its metadata once the trainer says its save ended.

`verify(path, step)` detects the checkpoint's format and checks it without reading its tensors'
data: headers, indexes, zip central directories, file sizes. It never raises: a checkpoint that
is partial or damaged is a `Verdict` whose `problem` says which file, which entry, which offset,
and whose `fix` says what to do. The supervisor runs it on a helper thread, never on the
trainer's step path (it stats and reads files, which can hang on a dead network mount). The
pickles involved are read with inert stand-ins (`esiwrap.shell.verify_files`): nothing in a checkpoint
runs, and torch is imported only for a DCP metadata layout the stand-ins cannot read. The cost
follows the number of tensors, not the bytes: a few KiB read and a few ms for a file of 16 tensors
of any size; about one page read and 25 us per tensor (4096 tensors: 0.2 s warm, 1.2 s with the
page cache dropped; benchmarks/verify.py).

Detection, first match:

    verl         a directory holding latest_checkpointed_iteration.txt or global_step_N/, or a
                 global_step_N directory
    hf-trainer   a checkpoint-N directory, or one holding trainer_state.json
    dcp          a directory holding .metadata, __R.metadata, .metadata.tmp or *.distcp
    directory    any other directory (with no file recognised below: as unknown)
    safetensors  *.safetensors
    lightning    *.ckpt (a torch zip whose data.pkl holds no pytorch-lightning_version: torch)
    torch        *.pt, *.pth, *.bin, or a file that starts with a zip local header
    unknown      anything else

What is checked, and how deep:

    torch        the end-of-central-directory record ends the file (its comment reaches the end;
                 the zip64 locator and record before it when present); the central directory lies
                 right before them and parses, entry count and size as recorded; every entry's
                 local header is at its offset with its name, and its data (with a data
                 descriptor) ends before the next entry or the directory; an <archive>/data.pkl
                 entry (up to 64 MiB) unpickles (stand-ins) and every storage it names is an entry
                 of the size it gives. A legacy pickle (torch < 1.6) is not checkable beyond
                 existence and size: as unknown
    safetensors  the 8-byte little-endian header length fits the file; the header is JSON; each
                 tensor's bytes are dtype x shape; the data_offsets tile the data section from 0
                 to its end, no gap, no overlap, nothing after
    lightning    torch, and data.pkl's dict holds state_dict, epoch and global_step (= `step`)
    dcp          .metadata (or every __R.metadata of a save without collectives) is read with
                 stand-ins: every storage file it names is there and reaches the end of its last
                 item. A layout the stand-ins cannot read is read by torch when importable, else
                 only its presence and size count (the verdict says so). No .metadata: invalid
                 (it is written last)
    verl         the tracker names step N (= `step`, = the directory's N); global_step_N/actor/
                 (and critic/) holds FSDP shards {model,optim,extra_state}_world_size_W_rank_R.pt
                 for every R < W (W from fsdp_config.json, written by rank 0 after its shards),
                 each a torch zip, or a Megatron save (ckpt_contents.json, written last; each
                 dist_ckpt/ as dcp); data.pt (written before the tracker); then as directory
    hf-trainer   trainer_state.json parses and its global_step is N (= `step`); model weights are
                 there (model.safetensors, pytorch_model.bin, an index, adapter_model.*,
                 pytorch_model_fsdp*, DeepSpeed's global_stepN/); shards have their index; then as
                 directory
    directory    every file below by its kind: *.pt, *.pth, *.bin, *.ckpt as torch, *.safetensors,
                 *.index.json (each weight_map file exists and holds its tensors), any other
                 *.json parses (up to 16 MiB), a directory with DCP metadata as dcp; other files
                 are counted, not checked
    unknown      it exists, it holds bytes, and its size and newest modification are the same
                 after `settle_s`
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from esiwrap.shell.verify_files import (
    FIX_CORRUPT,
    FIX_CUT,
    LOCAL,
    PICKLE_MAX_BYTES,
    Invalid,
    Reader,
    SafetensorsFile,
    TorchFile,
    check_json,
    check_safetensors,
    check_torch,
    read_pickle,
    state_of,
)

__all__ = ["SETTLE_S", "Verdict", "detect", "verify"]

SETTLE_S = 1.0  # unknown formats: the size must not change over this long
MAX_FILES = 100_000  # a directory's walk checks this many files at most

TRACKER = "latest_checkpointed_iteration.txt"
TRAINER_STATE = "trainer_state.json"
VERL_STEP = re.compile(r"global_step_(\d+)")
HF_STEP = re.compile(r"checkpoint-(\d+)")
VERL_SHARD = re.compile(r"(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt")
VERL_SHARD_KINDS = ("model", "optim", "extra_state")
MEGATRON_PARTS = ("model", "optimizer", "extra")
DCP_METADATA = ".metadata"
DCP_RANK_METADATA = re.compile(r"__\d+\.metadata")
HF_WEIGHTS = re.compile(r"(model|pytorch_model|adapter_model)(-\d+-of-\d+)?\.(safetensors|bin)"
                        r"(\.index\.json)?|pytorch_model_fsdp(_\d+)?(\.bin)?|global_step\d+")  # DeepSpeed's
HF_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")
LIGHTNING_KEYS = ("state_dict", "epoch", "global_step")
TORCH_SUFFIXES = (".pt", ".pth", ".bin")

FIX_MISSING = ("nothing is at this path: the save wrote elsewhere (check the path the trainer reports), "
               "or it was removed afterwards (a rotation of old checkpoints)")
FIX_EMPTY = ("nothing was written: the save failed before its first byte (a full disk? a path the "
             "trainer cannot write?); see the trainer's log")
FIX_GROWING = ("esiwrap was told the save ended while it was still being written: end `esi.saving()` only "
               "once the write is complete; an asynchronous save reports `save_snapshotted` and then "
               "`save_finished` when its write is durable")
FIX_UNREADABLE = ("esiwrap could not read it: check its permissions and the storage (a network mount "
                  "that stopped answering?)")
FIX_BUG = "a bug in esiwrap's check, not necessarily in the checkpoint: please report this message"
FIX_OTHER_STEP = ("this is another save's checkpoint, not the step the trainer reported: a save that "
                  "wrote elsewhere, or a rename that did not happen; check the path reported with the save")
FIX_TRACKER = ("verl writes latest_checkpointed_iteration.txt last, after actor/, critic/ and data.pt: "
               "this save did not finish, and verl would resume from the step the tracker named "
               "before. Resume from that step; if saves are cut short, leave them more time or space")
FIX_TRACKER_ASYNC = ("with actor.checkpoint.async_save=True (Megatron) verl does not write "
                     "latest_checkpointed_iteration.txt, so a resume starts from an older step (or from "
                     "scratch): once the async write is done (actor/ckpt_contents.json is there), write "
                     "this step's number into the tracker, or resume with trainer.resume_mode=resume_path "
                     "trainer.resume_from_path=<this global_step_N>")
FIX_LATER = ("verl resumes from the step the tracker names, a later save: check that one, or point "
             "trainer.resume_from_path at this one on purpose")
FIX_ROTATED = ("verl's checkpoint rotation (trainer.max_actor_ckpt_to_keep, max_critic_ckpt_to_keep) "
               "deletes an older step's actor/ and critic/ and leaves global_step_N/ with its data.pt: "
               "this step was rotated out (or its save stopped before actor/). Resume from the step the "
               "tracker names; keep more steps with a larger max_actor_ckpt_to_keep")
FIX_SHARD = ("a rank did not write its shard (it stopped, or its node's disk is another): every rank "
             "writes its own file, so with several nodes default_local_dir must be storage every node "
             "shares; resume from the previous checkpoint")


@dataclass(frozen=True)
class Verdict:
    """What `verify` found: `ok`, or the `problem` (which file, entry, offset) and its `fix`."""

    ok: bool
    format: str  # verl, hf-trainer, dcp, directory, safetensors, lightning, torch or unknown
    checked: str  # what was checked, in words (before the problem, when there is one)
    problem: str = ""
    fix: str = ""
    bytes: int = 0  # the checkpoint's total size
    files: int = 0
    read_bytes: int = 0  # what the check read of it
    seconds: float = 0.0
    path: str = ""

    def fields(self) -> dict[str, Any]:
        """Every field for a log line, seconds to the millisecond."""
        fields = asdict(self)
        fields["seconds"] = round(self.seconds, 3)
        return fields


def verify(path: str | os.PathLike[str], step: int | None = None, *, settle_s: float = SETTLE_S,
           sleep: Callable[[float], object] = time.sleep) -> Verdict:
    """Check the checkpoint at `path` (a file or a directory; see the module docstring for each
    format); `step`, the step the trainer reported saving, is compared where the format records
    one. `sleep` waits `settle_s` where only a settled size can be checked. Never raises."""
    started = time.monotonic()
    check = _Check(os.path.normpath(os.fspath(path)), step, settle_s, sleep)
    checked = problem = fix = ""
    try:
        if not os.path.exists(check.path):
            raise Invalid(f"{check.label(check.path)}: does not exist", FIX_MISSING)
        if not (os.path.isfile(check.path) or os.path.isdir(check.path)):
            raise Invalid(f"{check.label(check.path)}: neither a regular file nor a directory",
                          "a checkpoint is files in directories: check the path the trainer reports")
        check.format = detect(check.path)
        checked = CHECKS[check.format](check)
    except Invalid as exc:
        problem, fix = exc.problem, exc.fix
    except OSError as exc:
        where = check.label(os.fsdecode(exc.filename)) if exc.filename else check.label(check.path)
        problem, fix = f"{where}: {exc.strerror or exc}", FIX_UNREADABLE
    except Exception as exc:  # a bug here must not stop the supervisor: it is the verdict
        problem = f"{check.label(check.path)}: the check failed: {type(exc).__name__}: {exc}"
        fix = FIX_BUG
    size = _tally(check.scope)
    return Verdict(ok=not problem, format=check.format, checked=checked or check.summary(), problem=problem,
                   fix=fix, bytes=size.bytes, files=size.files, read_bytes=check.reader.read_bytes,
                   seconds=time.monotonic() - started, path=check.path)


def detect(path: str) -> str:
    """The format `verify` checks `path` as (the module docstring's detection table)."""
    name = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        names = set(os.listdir(path))
        if TRACKER in names or VERL_STEP.fullmatch(name) or any(VERL_STEP.fullmatch(n) for n in names):
            return "verl"
        if TRAINER_STATE in names or HF_STEP.fullmatch(name):
            return "hf-trainer"
        if _is_dcp(names):
            return "dcp"
        return "directory"
    lower = name.lower()
    if lower.endswith(".safetensors"):
        return "safetensors"
    if lower.endswith(".ckpt"):
        return "lightning"
    if lower.endswith(TORCH_SUFFIXES):
        return "torch"
    with open(path, "rb") as handle:
        return "torch" if handle.read(4) == LOCAL else "unknown"


class _Tally(NamedTuple):
    bytes: int
    files: int
    newest_ns: int

    def words(self) -> str:
        return f"{self.bytes} bytes in {_plural(self.files, 'file')}"


class _Check:
    """One `verify` call: what it asks, what it read, and the files checked so far (each once)."""

    def __init__(self, path: str, step: int | None, settle_s: float,
                 sleep: Callable[[float], object]) -> None:
        self.path, self.step, self.settle_s, self.sleep = path, step, settle_s, sleep
        self.format = "unknown"
        self.scope = path  # what bytes and files count: the checkpoint (verl: its step directory)
        self.reader = Reader()
        self.counts: Counter[str] = Counter()
        self._base = os.path.dirname(path)
        self._torch: dict[str, TorchFile] = {}
        self._safetensors: dict[str, SafetensorsFile] = {}
        self._json: dict[str, Any] = {}
        self._dcp: dict[str, str] = {}

    def relabel(self, root: str) -> None:
        """Name files from `root`'s own name down (a verl step directory: from the run's)."""
        self._base = os.path.dirname(root)

    def label(self, path: str) -> str:
        """`path` as problems name it: from the checked path's own name down."""
        return os.path.relpath(path, self._base) if self._base else path

    def summary(self) -> str:
        """What was checked so far: "2 torch zips, 1 JSON file"."""
        return ", ".join(_plural(n, kind) for kind, n in self.counts.items())

    # ------------------------------------------------------------------ one file or directory each
    def torch(self, path: str) -> TorchFile:
        if path not in self._torch:
            self._torch[path] = found = check_torch(self.reader, path, self.label(path))
            self.counts["torch zip" if found.kind == "zip" else "legacy torch pickle"] += 1
        return self._torch[path]

    def safetensors(self, path: str) -> SafetensorsFile:
        if path not in self._safetensors:
            self._safetensors[path] = check_safetensors(self.reader, path, self.label(path))
            self.counts["safetensors file"] += 1
        return self._safetensors[path]

    def json(self, path: str) -> Any:
        if path not in self._json:
            self._json[path] = check_json(self.reader, path, self.label(path))
            self.counts["JSON file"] += 1
        return self._json[path]

    def dcp(self, directory: str) -> str:
        if directory not in self._dcp:
            self._dcp[directory] = _check_dcp_dir(self, directory)
            self.counts["DCP dir"] += 1
        return self._dcp[directory]

    def index(self, path: str) -> None:
        """A Hugging Face `*.index.json`: each file its weight_map names exists, passes its own
        check, and holds the tensors mapped to it."""
        index = self.json(path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            return
        directory, label = os.path.dirname(path), self.label(path)
        held: dict[str, frozenset[str] | None] = {}
        for tensor, name in weight_map.items():
            if not isinstance(name, str):
                raise Invalid(f"{label}: its weight_map gives {tensor!r} no file name ({name!r:.80})",
                              FIX_CORRUPT)
            if name not in held:
                shard = os.path.join(directory, name)
                if not os.path.isfile(shard):
                    raise Invalid(f"{label}: its weight_map names {name}, which is missing")
                held[name] = self._tensors(shard)
            names = held[name]
            if names is not None and tensor not in names:
                raise Invalid(f"{label}: its weight_map puts {tensor!r} in {name}, which does not hold it",
                              FIX_CORRUPT)
        self.counts["weight map"] += 1

    def _tensors(self, path: str) -> frozenset[str] | None:
        if path.endswith(".safetensors"):
            return self.safetensors(path).tensors
        top = self.torch(path).top
        return frozenset(str(k) for k in top) if isinstance(top, dict) else None

    def contents(self, top: str) -> str:
        """Every file below `top` checked by its kind (the `directory` row of the table)."""
        walked = other = 0

        def fail(error: OSError) -> None:
            raise error

        for root, dirs, names in os.walk(top, onerror=fail):
            dirs.sort()
            dcp = _is_dcp(set(names))
            if dcp:
                self.dcp(root)
            for name in sorted(names):
                walked += 1
                if walked > MAX_FILES:
                    return self.summary() + f"; stopped after {MAX_FILES} files"
                kind = _kind(name)
                if kind is not None:
                    CONTENTS[kind](self, os.path.join(root, name))
                elif not (dcp and (name.endswith(".distcp") or name.endswith(".metadata"))):
                    other += 1
        return self.summary() + (f"; {_plural(other, 'other file')} not checked" if other else "")


def _kind(name: str) -> str | None:
    lower = name.lower()
    if lower.endswith(".safetensors"):
        return "safetensors"
    if lower.endswith((*TORCH_SUFFIXES, ".ckpt")):
        return "torch"
    if lower.endswith(".index.json"):
        return "index"
    if lower.endswith(".json"):
        return "json"
    return None


CONTENTS: dict[str, Callable[[_Check, str], object]] = {
    "safetensors": _Check.safetensors,
    "torch": _Check.torch,
    "index": _Check.index,
    "json": _Check.json,
}


# ---------------------------------------------------------------------------------- one per format
def _check_torch(check: _Check) -> str:
    found = check.torch(check.path)
    if found.kind == "pickle":
        return f"{found.describe()}; {_settled(check)}"
    return found.describe()


def _check_safetensors(check: _Check) -> str:
    found = check.safetensors(check.path)
    return (f"safetensors: {len(found.tensors)} tensors in {found.data_bytes} bytes after a "
            f"{found.header_bytes}-byte header")


def _check_lightning(check: _Check) -> str:
    found = check.torch(check.path)
    top = found.top
    if not (isinstance(top, dict) and "pytorch-lightning_version" in top):
        check.format = "torch"
        return _check_torch(check) + ("; no pytorch-lightning_version in data.pkl: checked as torch"
                                      if isinstance(top, dict) else "")
    label = check.label(check.path)
    missing = [key for key in LIGHTNING_KEYS if key not in top]
    if missing:
        raise Invalid(f"{label}: a Lightning checkpoint without {', '.join(missing)}", FIX_CORRUPT)
    global_step = top["global_step"]
    if check.step is not None and isinstance(global_step, int) and global_step != check.step:
        raise Invalid(f"{label}: global_step {global_step}, and the trainer reported saving step "
                      f"{check.step}", FIX_OTHER_STEP)
    return (f"{found.describe()}; Lightning {top['pytorch-lightning_version']}: epoch {top['epoch']}, "
            f"global_step {global_step}")


def _check_dcp(check: _Check) -> str:
    described = check.dcp(check.path)
    rest = check.contents(check.path)
    return described if set(check.counts) == {"DCP dir"} else f"{described}; {rest}"


def _check_directory(check: _Check) -> str:
    summary = check.contents(check.path)
    if not check.counts:
        check.format = "unknown"
        return _check_unknown(check)
    return summary


def _check_unknown(check: _Check) -> str:
    return f"{_settled(check)}; format not recognised: contents not checked"


def _check_hf_trainer(check: _Check) -> str:
    path = check.path
    label = check.label(path)
    state_path = os.path.join(path, TRAINER_STATE)
    if not os.path.isfile(state_path):
        raise Invalid(f"{label}/{TRAINER_STATE} is missing: the Trainer writes it last, after the weights, "
                      "optimizer, scheduler and RNG state, so the save did not finish", FIX_CUT)
    state = check.json(state_path)
    global_step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(global_step, int):
        raise Invalid(f"{label}/{TRAINER_STATE}: no integer global_step", FIX_CORRUPT)
    named = HF_STEP.fullmatch(os.path.basename(path))
    if named and int(named.group(1)) != global_step:
        raise Invalid(f"{label}/{TRAINER_STATE}: global_step {global_step}, not the directory's "
                      f"{named.group(1)}", FIX_OTHER_STEP)
    if check.step is not None and global_step != check.step:
        raise Invalid(f"{label}: global_step {global_step}, and the trainer reported saving step "
                      f"{check.step}", FIX_OTHER_STEP)
    names = sorted(os.listdir(path))
    weights = [name for name in names if HF_WEIGHTS.fullmatch(name)]
    if not weights:
        raise Invalid(f"{label}: no model weights (model.safetensors, pytorch_model.bin, their .index.json, "
                      "adapter_model.*, pytorch_model_fsdp*, DeepSpeed's global_stepN/): the Trainer writes "
                      "them first", FIX_CUT)
    for shard in (name for name in weights if HF_SHARD.fullmatch(name)):
        index = re.sub(r"-\d+-of-\d+", "", shard) + ".index.json"
        if index not in names:
            raise Invalid(f"{label}: {shard} is there and {index} is not: save_pretrained writes the index "
                          "after the shards", FIX_CUT)
    rest = check.contents(path)
    return f"hf-trainer: global_step {global_step}, weights {', '.join(weights)}; {rest}"


def _check_verl(check: _Check) -> str:
    named = VERL_STEP.fullmatch(os.path.basename(check.path))
    root = os.path.dirname(check.path) if named else check.path
    check.relabel(root)
    tracked = _read_tracker(check, root)
    if named:
        step = int(named.group(1))
    elif check.step is not None:
        step = check.step
    elif tracked is not None:
        step = tracked
    else:
        steps = sorted(int(m.group(1)) for n in os.listdir(root) if (m := VERL_STEP.fullmatch(n)))
        newest = os.path.join(root, f"global_step_{steps[-1]}") if steps else root
        raise Invalid(f"{check.label(root)}/{TRACKER} is missing (newest: {os.path.basename(newest)})",
                      _tracker_fix(newest))
    step_dir = os.path.join(root, f"global_step_{step}")
    check.scope = step_dir
    label = check.label(step_dir)
    if check.step is not None and step != check.step:
        raise Invalid(f"{label}: step {step}, and the trainer reported saving step {check.step}",
                      FIX_OTHER_STEP)
    if not os.path.isdir(step_dir):
        raise Invalid(f"{label} is missing" + (f"; {check.label(root)}/{TRACKER} names step {tracked}"
                                               if tracked is not None else ""),
                      "the step's directory is not here (the trainer's default_local_dir is elsewhere?) "
                      "or was removed: resume from the step the tracker names")
    if tracked is None:
        raise Invalid(f"{check.label(root)}/{TRACKER} is missing: verl writes it last, after {label}/",
                      _tracker_fix(step_dir))
    if tracked < step:
        raise Invalid(f"{check.label(root)}/{TRACKER} names step {tracked}, not {step}: the save of step "
                      f"{step} did not finish (verl writes the tracker last)", _tracker_fix(step_dir))
    if tracked > step:
        rotated = not os.path.isdir(os.path.join(step_dir, "actor")) and os.path.isfile(
            os.path.join(step_dir, "data.pt"))
        raise Invalid(f"{check.label(root)}/{TRACKER} names step {tracked}, a later save: verl resumes from "
                      f"that one, not from step {step}"
                      + ("; this step's actor/ is gone and its data.pt left: rotated out" if rotated else ""),
                      FIX_ROTATED if rotated else FIX_LATER)
    roles = [_check_verl_role(check, step_dir, role) for role in ("actor", "critic")
             if role == "actor" or os.path.isdir(os.path.join(step_dir, role))]
    if not os.path.isfile(os.path.join(step_dir, "data.pt")):
        raise Invalid(f"{label}/data.pt is missing: verl writes it after actor/ and critic/, before the "
                      "tracker", FIX_CUT)
    rest = check.contents(step_dir)
    return f"verl: {TRACKER} names step {step}; {'; '.join(roles)}; {rest}"


def _read_tracker(check: _Check, root: str) -> int | None:
    path = os.path.join(root, TRACKER)
    if not os.path.isfile(path):
        return None
    text = check.reader.read_whole(path).decode("utf-8", "replace").strip()
    if not text.isdigit():
        raise Invalid(f"{check.label(path)}: {text[:40]!r} is not a step number (verl writes the number "
                      "alone)", FIX_CUT)
    return int(text)


def _tracker_fix(step_dir: str) -> str:
    actor = os.path.join(step_dir, "actor")
    megatron = os.path.isfile(os.path.join(actor, "ckpt_contents.json")) or any(
        os.path.isdir(os.path.join(actor, part, "dist_ckpt")) for part in MEGATRON_PARTS)
    return FIX_TRACKER_ASYNC if megatron else FIX_TRACKER


def _check_verl_role(check: _Check, step_dir: str, role: str) -> str:
    """actor/ (or critic/): FSDP shards of every rank, or a Megatron save."""
    directory = os.path.join(step_dir, role)
    label = check.label(directory)
    if not os.path.isdir(directory):
        if os.path.isfile(os.path.join(step_dir, "data.pt")):
            raise Invalid(f"{label} is missing, and data.pt is there", FIX_ROTATED)
        raise Invalid(f"{label} is missing: the save stopped before writing it", FIX_CUT)
    names = os.listdir(directory)
    shards: dict[str, dict[int, set[int]]] = {}
    for name in names:
        if m := VERL_SHARD.fullmatch(name):
            shards.setdefault(m.group(1), {}).setdefault(int(m.group(2)), set()).add(int(m.group(3)))
    if shards:
        return _check_fsdp_shards(check, directory, shards)
    if "ckpt_contents.json" in names or any(
            os.path.isdir(os.path.join(directory, part, "dist_ckpt")) for part in MEGATRON_PARTS):
        return _check_megatron(check, directory)
    raise Invalid(f"{label}: no shards (model_world_size_W_rank_R.pt) and no Megatron dist_ckpt/: the save "
                  "stopped before writing any", FIX_CUT)


def _check_fsdp_shards(check: _Check, directory: str, shards: dict[str, dict[int, set[int]]]) -> str:
    label = check.label(directory)
    config_path = os.path.join(directory, "fsdp_config.json")
    if not os.path.isfile(config_path):
        raise Invalid(f"{label}/fsdp_config.json is missing: rank 0 writes it after its shards, so the save "
                      "did not finish", FIX_CUT)
    config = check.json(config_path)
    world = config.get("world_size") if isinstance(config, dict) else None
    if not isinstance(world, int) or world < 1:
        raise Invalid(f"{label}/fsdp_config.json: no world_size", FIX_CORRUPT)
    if "model" not in shards:
        raise Invalid(f"{label}/model_world_size_{world}_rank_0.pt is missing (no model shard at all)",
                      FIX_SHARD)
    for kind in VERL_SHARD_KINDS:
        worlds = shards.get(kind, {})
        others = sorted(w for w in worlds if w != world)
        if others:
            raise Invalid(f"{label}: {kind}_world_size_{others[0]}_rank_*.pt, and fsdp_config.json says "
                          f"world size {world}: shards of two saves", FIX_CORRUPT)
        if not worlds:
            continue  # not saved (save_contents)
        ranks = worlds.get(world, set())
        missing = [rank for rank in range(world) if rank not in ranks]
        if missing:
            raise Invalid(f"{label}/{kind}_world_size_{world}_rank_{missing[0]}.pt is missing "
                          f"({len(ranks)} of {world} ranks' {kind} shards are there)", FIX_SHARD)
        for rank in range(world):
            check.torch(os.path.join(directory, f"{kind}_world_size_{world}_rank_{rank}.pt"))
    kinds = "+".join(kind for kind in VERL_SHARD_KINDS if kind in shards)
    return f"{os.path.basename(directory)}/: FSDP {kinds} shards of {_plural(world, 'rank')}"


def _check_megatron(check: _Check, directory: str) -> str:
    label = check.label(directory)
    manifest = os.path.join(directory, "ckpt_contents.json")
    if not os.path.isfile(manifest):
        raise Invalid(f"{label}/ckpt_contents.json is missing: verl's Megatron save writes it last (after an "
                      "async write completes), so the save did not finish", FIX_TRACKER_ASYNC)
    check.json(manifest)
    parts = [os.path.join(directory, part, "dist_ckpt") for part in MEGATRON_PARTS]
    present = [part for part in parts if os.path.isdir(part)]
    for part in present:
        check.dcp(part)
    return f"{os.path.basename(directory)}/: Megatron, ckpt_contents.json and {len(present)} dist_ckpt dirs"


CHECKS: dict[str, Callable[[_Check], str]] = {
    "verl": _check_verl,
    "hf-trainer": _check_hf_trainer,
    "dcp": _check_dcp,
    "directory": _check_directory,
    "safetensors": _check_safetensors,
    "lightning": _check_lightning,
    "torch": _check_torch,
    "unknown": _check_unknown,
}


# ---------------------------------------------------------------------------------- DCP
def _is_dcp(names: set[str]) -> bool:
    return bool(_dcp_metadata(names)) or any(
        name.endswith((".distcp", ".metadata.tmp")) for name in names)


def _dcp_metadata(names: set[str]) -> list[str]:
    """`.metadata`, or the `__R.metadata` of each rank of a save without collectives."""
    if DCP_METADATA in names:
        return [DCP_METADATA]
    return sorted(name for name in names if DCP_RANK_METADATA.fullmatch(name))


def _check_dcp_dir(check: _Check, directory: str) -> str:
    label = check.label(directory)
    names = set(os.listdir(directory))
    metadata = _dcp_metadata(names)
    if not metadata:
        partial = sorted(name for name in names if name.endswith(".metadata.tmp"))
        if partial:
            raise Invalid(f"{label}: {partial[0]} and no .metadata: the save stopped while writing its "
                          "metadata (written last)")
        raise Invalid(f"{label}/.metadata is missing: the save did not finish (.metadata is written last)")
    items = files = 0
    for name in metadata:
        path = os.path.join(directory, name)
        size = os.stat(path).st_size
        if size == 0:
            raise Invalid(f"{check.label(path)}: empty (0 bytes)")
        ends = _storage_ends(check, directory, name, size)
        if ends is None:
            return (f"DCP: {name} ({size} bytes) present, in a layout esiwrap cannot read (and torch could "
                    "not): storage files not checked")
        for relative, (end, fqn, count) in sorted(ends.items()):
            storage = os.path.normpath(os.path.join(directory, relative))
            if os.path.dirname(storage) != os.path.normpath(directory):
                raise Invalid(f"{check.label(path)} names {relative!r}, outside its directory", FIX_CORRUPT)
            if not os.path.isfile(storage):
                raise Invalid(f"{label}/{relative} is missing; {name} places {_plural(count, 'item')} in it")
            length = os.stat(storage).st_size
            if length < end:
                raise Invalid(f"{label}/{relative} is {length} bytes; {name} places {fqn!r} in it up to byte "
                              f"{end}: the file is cut short")
            items, files = items + count, files + 1
    return (f"DCP: {'+'.join(metadata)} places {_plural(items, 'item')} in {_plural(files, 'storage file')}, "
            "each there and long enough")


def _storage_ends(check: _Check, directory: str, name: str,
                  size: int) -> dict[str, tuple[int, str, int]] | None:
    """Each storage file the metadata names: (end of its last item, that item's name, items);
    None when neither the stand-ins nor torch can read the metadata's layout."""
    if size > PICKLE_MAX_BYTES:
        return None
    top, _ = read_pickle(check.reader.read_whole(os.path.join(directory, name)), check.label(
        os.path.join(directory, name)))
    found = _ends(state_of(top).get("storage_data"), lambda o: state_of(o))
    if found is None:
        found = _ends_with_torch(directory, name)
        check.reader.read_bytes += size if found is not None else 0
    return found


def _ends(storage_data: Any,
          fields: Callable[[Any], dict[str, Any]]) -> dict[str, tuple[int, str, int]] | None:
    """(end, name of the last item, items) of each storage file in DCP's `storage_data`, whose
    values `fields` turns into a dict; None when it is not in that shape."""
    if not isinstance(storage_data, dict) or not storage_data:
        return None
    ends: dict[str, tuple[int, str, int]] = {}
    for index, info in storage_data.items():
        got = fields(info)
        relative, offset, length = got.get("relative_path"), got.get("offset"), got.get("length")
        if not (isinstance(relative, str) and isinstance(offset, int) and isinstance(length, int)):
            return None
        end, fqn, count = ends.get(relative, (0, "", 0))
        if offset + length >= end:
            end, fqn = offset + length, str(fields(index).get("fqn", "?"))
        ends[relative] = (end, fqn, count + 1)
    return ends


def _ends_with_torch(directory: str, name: str) -> dict[str, tuple[int, str, int]] | None:
    """torch's own reader, for a layout the stand-ins do not know (it unpickles for real: the
    trainer would load this checkpoint anyway). None when torch is not importable or cannot read
    it either."""
    try:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
    except ImportError:
        return None
    rank = int(name[2:-len(DCP_METADATA)]) if DCP_RANK_METADATA.fullmatch(name) else None
    try:
        metadata = FileSystemReader(directory).read_metadata(rank=rank)
    except Exception:  # a metadata file torch does not read either: presence and size only
        return None
    return _ends(getattr(metadata, "storage_data", None), lambda o: dict(getattr(o, "__dict__", {})))


# ---------------------------------------------------------------------------------- size only
def _settled(check: _Check) -> str:
    """The path holds bytes, and the same bytes (and newest modification) after `settle_s`."""
    label = check.label(check.path)
    first = _tally(check.path)
    if first.bytes == 0:
        what = ("empty (0 bytes)" if os.path.isfile(check.path) else
                f"{_plural(first.files, 'file')}, all empty" if first.files else "an empty directory")
        raise Invalid(f"{label}: {what}", FIX_EMPTY)
    check.sleep(check.settle_s)
    second = _tally(check.path)
    if second != first:
        change = (f"{first.words()}, then {second.words()}" if second[:2] != first[:2]
                  else f"{first.words()}, modified again")
        raise Invalid(f"{label}: still being written: {change} {check.settle_s:g} s later", FIX_GROWING)
    return f"{first.words()}, unchanged over {check.settle_s:g} s"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _tally(path: str) -> _Tally:
    """Bytes, files and newest modification of the regular files at or under `path` (0s when it
    is gone)."""
    total = files = newest = 0
    try:
        if not os.path.isdir(path):
            st = os.stat(path)
            return _Tally(st.st_size, 1, st.st_mtime_ns)
        for root, _dirs, names in os.walk(path):
            for name in names:
                try:
                    st = os.stat(os.path.join(root, name))
                except OSError:
                    continue
                total, files, newest = total + st.st_size, files + 1, max(newest, st.st_mtime_ns)
                if files >= MAX_FILES:
                    return _Tally(total, files, newest)
    except OSError:
        pass
    return _Tally(total, files, newest)
