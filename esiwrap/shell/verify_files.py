"""The checkpoint files `esiwrap.shell.verify` reads by hand: their metadata, never their tensors' data.

* A `torch.save` file (torch >= 1.6) is a zip of stored entries: `<archive>/data.pkl` (the object,
  with each tensor's storage as a persistent id) and `<archive>/data/<key>` (each storage's
  bytes). Read: the end-of-central-directory record (and the zip64 locator and record, which
  torch always writes), the central directory, each entry's local header (30 bytes and its name),
  and `data.pkl`, unpickled without running anything (below): every storage it names must be an
  entry of the size it gives (elements x the element size of its storage type).
* A safetensors file: the 8-byte little-endian header length and the JSON header.
* A pickle (a DCP `.metadata`, a torch `data.pkl`) is unpickled with every class and function it
  names replaced by an inert stand-in (`Stub`) that records its arguments and state, except a few
  plain containers (`SAFE_GLOBALS`). Nothing in the file runs, so a checkpoint from anywhere can
  be read, and torch is never imported.

Every read goes through a `Reader` (`os.pread`), which counts the bytes it read. A problem is raised
as `Invalid(problem, fix)`: the problem names the file, the entry and the offset.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import struct
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

PICKLE_MAX_BYTES = 64 << 20  # a data.pkl or .metadata above this is not read (only its size counts)
JSON_MAX_BYTES = 16 << 20  # a JSON file above this is not parsed
SAFETENSORS_MAX_HEADER = 100_000_000  # safetensors' own limit on the header
ZIP_MAX_COMMENT = 0xFFFF

FIX_CUT = ("the save was cut short (its process stopped mid-write, or the disk filled): resume from "
           "the previous checkpoint, and check the free space where checkpoints go (df)")
FIX_CORRUPT = ("the file is damaged (not only short): resume from the previous checkpoint; if saves "
               "keep failing this way, check the storage (dmesg) and the saving code")
FIX_FORMAT = ("this is not the format its name says: check what the trainer writes under this name, "
              "or rename the file")

EOCD, EOCD64, LOCATOR64 = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
CENTRAL, LOCAL = b"PK\x01\x02", b"PK\x03\x04"
U16_MAX, U32_MAX = 0xFFFF, 0xFFFFFFFF
DATA_DESCRIPTOR_MIN = 12  # crc and two 32-bit sizes, after an entry whose flags have bit 3
LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"  # pickled 0x1950a86a20f9469cfc6c

# bytes per element of each storage type torch pickles (UntypedStorage counts bytes)
STORAGE_ITEMSIZE = {
    "UntypedStorage": 1, "ByteStorage": 1, "CharStorage": 1, "BoolStorage": 1, "QInt8Storage": 1,
    "QUInt8Storage": 1, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "ShortStorage": 2,
    "HalfStorage": 2, "BFloat16Storage": 2, "IntStorage": 4, "FloatStorage": 4, "QInt32Storage": 4,
    "LongStorage": 8, "DoubleStorage": 8, "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16,
}
# bits per element of each safetensors dtype
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "I64": 64, "U64": 64, "F64": 64,
}
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    **{("builtins", t.__name__): t for t in (dict, list, tuple, set, frozenset, int, float, complex,
                                            str, bytes, bytearray, bool, slice, range)},
}


class Invalid(Exception):
    """What is wrong with a checkpoint, exactly; `fix` is what the user should do."""

    def __init__(self, problem: str, fix: str = FIX_CUT) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


# ------------------------------------------------------------------------------------ reading
class Reader:
    """Opens files and reads them by offset; `read_bytes` counts every byte read."""

    def __init__(self) -> None:
        self.read_bytes = 0

    @contextmanager
    def open(self, path: str) -> Iterator[Opened]:
        """The file, open for reads by offset, its access advised random (POSIX_FADV_RANDOM): the
        kernel does not read ahead from a local header into the tensor data after it."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError, AttributeError):  # advice only; not on every system
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            yield Opened(self, fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def read_whole(self, path: str) -> bytes:
        with self.open(path) as f:
            return f.read(0, f.size)


@dataclass
class Opened:
    reader: Reader
    fd: int
    size: int  # at opening

    def read(self, offset: int, n: int) -> bytes:
        """Up to `n` bytes at `offset` (fewer where the file ends)."""
        chunks = []
        while n > 0:
            chunk = os.pread(self.fd, min(n, 1 << 30), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset, n = offset + len(chunk), n - len(chunk)
        data = b"".join(chunks)
        self.reader.read_bytes += len(data)
        return data


# ------------------------------------------------------------------------------------ pickles
class Stub:
    """Stands in for a class or function a pickle names: calling or building it records the
    arguments (`args`), the state (`state`) and any items or elements; nothing else runs."""

    module: ClassVar[str] = ""
    qualname: ClassVar[str] = ""
    args: tuple[Any, ...]
    state: Any
    items: dict[Any, Any]
    elements: list[Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        stub = object.__new__(cls)
        stub.args, stub.state, stub.items, stub.elements = args, None, {}, []
        return stub

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def extend(self, values: list[Any]) -> None:
        self.elements.extend(values)

    def append(self, value: Any) -> None:
        self.elements.append(value)


_stubs: dict[tuple[str, str], type[Stub]] = {}


def stub_class(module: str, name: str) -> type[Stub]:
    """The stand-in for `module.name` (one class per name, so stubs of one kind compare)."""
    key = (module, name)
    if key not in _stubs:
        _stubs[key] = type(name.rpartition(".")[2] or "Stub", (Stub,), {"module": module, "qualname": name})
    return _stubs[key]


def state_of(obj: Any) -> dict[str, Any]:
    """A stub's fields: its state dict (or dict and slots, as protocol 2 pickles a dataclass)."""
    state = obj.state if isinstance(obj, Stub) else None
    if isinstance(state, tuple) and len(state) == 2:
        merged: dict[str, Any] = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        return merged
    return state if isinstance(state, dict) else {}


class _StubUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.persistent_ids: list[Any] = []

    def find_class(self, module: str, name: str) -> Any:
        return SAFE_GLOBALS.get((module, name)) or stub_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        self.persistent_ids.append(pid)
        return stub_class("<persistent>", "id")(pid)


def read_pickle(data: bytes, label: str) -> tuple[Any, list[Any]]:
    """The object pickled in `data` (classes and functions as stubs) and its persistent ids, in
    order. A pickle that does not load is `Invalid`."""
    unpickler = _StubUnpickler(data)
    try:
        top = unpickler.load()
    except Exception as exc:  # any damage: a bad opcode, a cut stream, a call with wrong arguments
        raise Invalid(f"{label}: does not unpickle ({type(exc).__name__}: {exc})", FIX_CORRUPT) from exc
    return top, unpickler.persistent_ids


# ------------------------------------------------------------------------------------ zip
@dataclass(frozen=True)
class ZipEntry:
    name: str
    header_offset: int
    data_offset: int
    size: int  # the bytes stored (compressed size)
    file_size: int  # the bytes once extracted
    method: int  # 0 stored, 8 deflated


@dataclass(frozen=True)
class _End:
    entries: int
    cd_size: int
    cd_offset: int
    cd_end: int  # where the central directory must end: the first end record


def _find_end(f: Opened, label: str) -> _End:
    """The end records: EOCD at the very end (or before a comment that reaches the end), and the
    zip64 locator and record just before it when there are any."""
    tail = f.read(f.size - 22, 22)
    pos = f.size - 22 if tail[:4] == EOCD and tail[-2:] == b"\0\0" else -1
    if pos < 0:  # a comment after the record (torch writes none): look further back
        tail_start = max(0, f.size - 22 - ZIP_MAX_COMMENT)
        tail = f.read(tail_start, f.size - tail_start)
        at = tail.rfind(EOCD, 0, len(tail) - 21)
        while at >= 0:
            (comment,) = struct.unpack_from("<H", tail, at + 20)
            if tail_start + at + 22 + comment == f.size:
                pos = tail_start + at
                break
            at = tail.rfind(EOCD, 0, at)
    if pos < 0:
        raise Invalid(f"{label}: no end-of-central-directory record at the end of its {f.size} bytes: "
                      "the file is cut short (or is not a zip)")
    record = f.read(pos, 22)
    disk, cd_disk, _n_disk, entries, cd_size, cd_offset, _comment = struct.unpack_from("<4H2IH", record, 4)
    cd_end = pos
    locator = f.read(pos - 20, 20) if pos >= 20 else b""
    if locator[:4] == LOCATOR64:
        _disk64, eocd64, _disks = struct.unpack_from("<IQI", locator, 4)
        record64 = f.read(eocd64, 56) if eocd64 + 56 <= pos - 20 else b""
        if record64[:4] != EOCD64:
            moved = pos - 20 - 56  # where a zip64 record of no extra data, the usual, ends at the locator
            shift = (f": it is at offset {moved}, so {abs(eocd64 - moved)} bytes are "
                     f"{'missing from' if eocd64 > moved else 'added to'} the file before it"
                     if moved >= 0 and f.read(moved, 4) == EOCD64 else "")
            raise Invalid(f"{label}: the zip64 locator at offset {pos - 20} points to offset {eocd64}, "
                          f"where there is no zip64 end record{shift}", FIX_CORRUPT)
        (length,) = struct.unpack_from("<Q", record64, 4)
        if eocd64 + 12 + length != pos - 20:
            raise Invalid(f"{label}: the zip64 end record at offset {eocd64} ({12 + length} bytes) does "
                          f"not end at the locator (offset {pos - 20})", FIX_CORRUPT)
        disk, cd_disk, _n_disk64, entries, cd_size, cd_offset = struct.unpack_from("<2I4Q", record64, 16)
        cd_end = eocd64
    elif entries == U16_MAX or U32_MAX in (cd_size, cd_offset):
        raise Invalid(f"{label}: the end record at offset {pos} needs a zip64 record, and there is none",
                      FIX_CORRUPT)
    if disk or cd_disk:
        raise Invalid(f"{label}: a multi-part zip (disk {disk}): not a torch.save file", FIX_FORMAT)
    if cd_offset + cd_size != cd_end:
        raise Invalid(f"{label}: the central directory ({cd_size} bytes at offset {cd_offset}) does not "
                      f"end where the end records begin (offset {cd_end}): bytes are missing from, or "
                      "were added to, the middle of the file", FIX_CORRUPT)
    return _End(entries, cd_size, cd_offset, cd_end)


def _zip64_extra(extra: bytes, values: list[int]) -> list[int]:
    """`values` (size, compressed size, header offset) with each 0xFFFFFFFF replaced, in order,
    from the zip64 extended information field."""
    at = 0
    while at + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, at)
        if tag == 1:
            field, out, used = extra[at + 4:at + 4 + length], [], 0
            for value in values:
                if value == U32_MAX and used + 8 <= len(field):
                    (value,) = struct.unpack_from("<Q", field, used)
                    used += 8
                out.append(value)
            return out
        at += 4 + length
    return values


def read_zip(f: Opened, label: str) -> dict[str, ZipEntry]:
    """The entries of the zip `f`: its end records and central directory parse, and each entry's
    local header is where the directory says, with its name, and its data ends before the next
    entry (or the directory). Anything else is `Invalid`."""
    if f.size < 22:
        raise Invalid(f"{label}: {f.size} bytes: too short to be a zip (its end record alone is 22)")
    end = _find_end(f, label)
    directory = f.read(end.cd_offset, end.cd_size)
    found: list[tuple[str, bytes, int, int, int, int, int]] = []
    at = 0
    while at < len(directory):
        if directory[at:at + 4] != CENTRAL or at + 46 > len(directory):
            raise Invalid(f"{label}: central directory entry {len(found)} at offset {end.cd_offset + at}: "
                          "no entry header there", FIX_CORRUPT)
        (flags, method, csize, usize, n, m, k, offset) = (
            struct.unpack_from("<2H", directory, at + 8) + struct.unpack_from("<2I3H", directory, at + 20)
            + struct.unpack_from("<I", directory, at + 42))
        raw = directory[at + 46:at + 46 + n]
        usize, csize, offset = _zip64_extra(directory[at + 46 + n:at + 46 + n + m], [usize, csize, offset])
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
        found.append((name, raw, offset, csize, usize, method, flags))
        at += 46 + n + m + k
    if at != len(directory) or len(found) != end.entries:
        raise Invalid(f"{label}: the central directory holds {len(found)} entries in {at} bytes; the end "
                      f"record says {end.entries} in {end.cd_size}", FIX_CORRUPT)
    found.sort(key=lambda e: e[2])
    entries: dict[str, ZipEntry] = {}
    for i, (name, raw, offset, csize, usize, method, flags) in enumerate(found):
        bound = found[i + 1][2] if i + 1 < len(found) else end.cd_offset
        header = f.read(offset, 30 + len(raw)) if offset + 30 <= end.cd_offset else b""
        if header[:4] != LOCAL:
            raise Invalid(f"{label}: entry {name}: no local header at offset {offset} "
                          f"(the central directory starts at {end.cd_offset})", FIX_CORRUPT)
        n, m = struct.unpack_from("<HH", header, 26)
        if header[30:30 + n] != raw:
            raise Invalid(f"{label}: entry {name}: the local header at offset {offset} names "
                          f"{header[30:30 + n]!r}", FIX_CORRUPT)
        data = offset + 30 + n + m
        after = data + csize + (DATA_DESCRIPTOR_MIN if flags & 0x8 else 0)
        if after > bound:
            raise Invalid(f"{label}: entry {name}: its {csize} bytes at offset {data} run past offset "
                          f"{bound}, where the next entry (or the central directory) begins", FIX_CORRUPT)
        entries[name] = ZipEntry(name, offset, data, csize, usize, method)
    return entries


# ------------------------------------------------------------------------------------ torch
@dataclass(frozen=True)
class TorchFile:
    """What a torch file's check found: `kind` "zip" or "pickle" (legacy, not checked), its
    entries and the storages data.pkl names, and data.pkl's object (stubs; None when not read)."""

    kind: str
    entries: int = 0
    storages: int = 0
    top: Any = None
    note: str = ""

    def describe(self) -> str:
        if self.kind == "pickle":
            return "a pickle (legacy torch.save, before 1.6): not checkable beyond existence and size"
        parts = f"a torch zip of {self.entries} entries, {self.storages} storages named by data.pkl"
        return parts + (f" ({self.note})" if self.note else "")


def check_torch(reader: Reader, path: str, label: str) -> TorchFile:
    """A torch.save file: a zip as `read_zip` checks it, with a `*/data.pkl` whose storages are all
    entries of their size; or a legacy pickle (only recognised)."""
    with reader.open(path) as f:
        if f.size == 0:
            raise Invalid(f"{label}: empty (0 bytes)")
        head = f.read(0, len(LEGACY_TORCH_MAGIC))
        if head[:1] == b"\x80":
            return TorchFile("pickle")
        if head[:4] != LOCAL:
            if LOCAL.startswith(head):
                raise Invalid(f"{label}: {f.size} bytes: only the start of a zip's first header")
            raise Invalid(f"{label}: neither a torch.save zip nor a pickle (it starts with {head[:8]!r})",
                          FIX_FORMAT)
        return _check_torch_zip(f, label)


def _check_torch_zip(f: Opened, label: str) -> TorchFile:
    entries = read_zip(f, label)
    pickles = sorted(name for name in entries if name.endswith("/data.pkl") and name.count("/") == 1)
    if not pickles:
        raise Invalid(f"{label}: a zip without a <archive>/data.pkl entry: not a torch.save file", FIX_FORMAT)
    pkl = entries[pickles[0]]
    prefix = pkl.name[: -len("data.pkl")]
    if pkl.method != 0 or pkl.size > PICKLE_MAX_BYTES:
        return TorchFile("zip", len(entries), note=f"{pkl.name} ({pkl.size} bytes) not read")
    top, pids = read_pickle(f.read(pkl.data_offset, pkl.size), f"{label}: {pkl.name}")
    storages: dict[str, int | None] = {}
    for pid in pids:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            continue
        kind = pid[1].qualname if isinstance(pid[1], type) and issubclass(pid[1], Stub) else ""
        itemsize, numel = STORAGE_ITEMSIZE.get(kind), pid[4]
        storages[str(pid[2])] = numel * itemsize if itemsize and isinstance(numel, int) else None
    for key, nbytes in storages.items():
        record = entries.get(f"{prefix}data/{key}")
        if record is None:
            raise Invalid(f"{label}: data.pkl names storage {key}, and there is no entry {prefix}data/{key}",
                          FIX_CORRUPT)
        if nbytes is not None and record.file_size != nbytes:
            raise Invalid(f"{label}: entry {record.name} holds {record.file_size} bytes; data.pkl gives "
                          f"that storage {nbytes}", FIX_CORRUPT)
    return TorchFile("zip", len(entries), len(storages), top)


# ------------------------------------------------------------------------------------ safetensors
@dataclass(frozen=True)
class SafetensorsFile:
    tensors: frozenset[str]
    header_bytes: int
    data_bytes: int


def check_safetensors(reader: Reader, path: str, label: str) -> SafetensorsFile:
    """The header length fits the file, the header is JSON, every tensor's bytes are its dtype x
    shape, and the tensors' data_offsets tile the data section: no gap, no overlap, no tail."""
    with reader.open(path) as f:
        if f.size < 8:
            raise Invalid(f"{label}: {f.size} bytes: too short for the 8-byte header length")
        (n,) = struct.unpack("<Q", f.read(0, 8))
        if n > min(f.size - 8, SAFETENSORS_MAX_HEADER):
            raise Invalid(f"{label}: the header length (first 8 bytes) is {n}, and {f.size - 8} bytes "
                          "follow: the file is cut short inside its header"
                          if n <= SAFETENSORS_MAX_HEADER else
                          f"{label}: the header length (first 8 bytes) is {n}: more than safetensors allows",
                          FIX_CUT if n <= SAFETENSORS_MAX_HEADER else FIX_CORRUPT)
        raw = f.read(8, n)
        data_bytes = f.size - 8 - n
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise Invalid(f"{label}: the {n}-byte header is not JSON ({exc})", FIX_CORRUPT) from exc
    if not isinstance(header, dict):
        raise Invalid(f"{label}: the header is JSON but not an object", FIX_CORRUPT)
    spans = sorted(_tensor_span(label, name, info) for name, info in header.items() if name != "__metadata__")
    start = 8 + n
    for _begin, end, name in spans:
        if end > data_bytes:
            raise Invalid(f"{label}: tensor {name!r} ends at byte {start + end} (data_offsets end {end}), "
                          f"and the file is {f.size} bytes: the file is cut short")
    expected = 0
    previous = ""
    for begin, end, name in spans:
        if begin != expected:
            what = "a gap of" if begin > expected else "an overlap of"
            raise Invalid(f"{label}: tensor {name!r} starts at data offset {begin}, after {previous!r} ends "
                          f"at {expected}: {what} {abs(begin - expected)} bytes", FIX_CORRUPT)
        expected, previous = end, name
    if expected != data_bytes:
        raise Invalid(f"{label}: {data_bytes - expected} bytes follow the last tensor (the tensors end at "
                      f"data offset {expected}, the data section is {data_bytes} bytes)", FIX_CORRUPT)
    return SafetensorsFile(frozenset(name for _, _, name in spans), n, data_bytes)


def _tensor_span(label: str, name: str, info: Any) -> tuple[int, int, str]:
    """(begin, end, name) of one header entry, its bytes checked against dtype x shape."""
    ok = isinstance(info, dict) and isinstance(info.get("dtype"), str)
    shape, offsets = (info.get("shape"), info.get("data_offsets")) if ok else (None, None)
    if not (ok and isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
            and isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise Invalid(f"{label}: tensor {name!r}: not a dtype, shape and data_offsets ({info!r:.200})",
                      FIX_CORRUPT)
    begin, end = offsets
    bits = SAFETENSORS_BITS.get(info["dtype"])  # a dtype newer than this table: its size is not checked
    if bits is not None and math.prod(shape) * bits != (end - begin) * 8:
        raise Invalid(f"{label}: tensor {name!r}: {info['dtype']} {shape} is {math.prod(shape) * bits / 8:g} "
                      f"bytes, and its data_offsets [{begin}, {end}] hold {end - begin}", FIX_CORRUPT)
    return begin, end, name


# ------------------------------------------------------------------------------------ JSON
def check_json(reader: Reader, path: str, label: str) -> Any:
    """The file's JSON value (None when it is too large to read); an empty or cut file is `Invalid`."""
    size = os.stat(path).st_size
    if size == 0:
        raise Invalid(f"{label}: empty (0 bytes)")
    if size > JSON_MAX_BYTES:
        return None
    data = reader.read_whole(path)
    try:
        return json.loads(data)
    except ValueError as exc:
        where = f" at byte {exc.pos} of {len(data)}" if isinstance(exc, json.JSONDecodeError) else ""
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise Invalid(f"{label}: not JSON ({msg}{where}): cut short or damaged") from exc
