"""How long `esiwrap.shell.verify.verify()` takes on checkpoints of several GB, and how much it reads.

    python benchmarks/verify.py                     # 4 GB per checkpoint, in a temporary directory
    python benchmarks/verify.py /scratch/bench --gb 8

Writes one checkpoint at a time into DIRECTORY (default: a new directory under
/work/tmp-verify-bench, removed afterwards), times `verify()` on it and deletes it before the next,
so the disk holds one checkpoint at a time (the free space is checked first):

    torch          torch.save of a state dict of 16 large float32 tensors (one zip64 file)
    torch-many     torch.save of 4096 tensors (an optimizer's many small states: one local
                   header read per tensor)
    safetensors    safetensors.torch.save_file of the 16 tensors
    dcp            torch.distributed.checkpoint.save of the 16 tensors, one process
    hf-sharded     save_pretrained-style shards: 8 safetensors files and their index.json

Each is verified cold (the page cache dropped first: `echo 3 > /proc/sys/vm/drop_caches` as root,
else each file's pages evicted with posix_fadvise DONTNEED; the table says which) and then warm.
Read is what verify read (its own count, `read_bytes`) beside the process's `rchar` and its
storage reads (`read_bytes` of /proc/self/io: whole pages, readahead included). Prints a Markdown
table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from esiwrap.shell.verify import verify

DEFAULT_PARENT = "/work/tmp-verify-bench"
GIB = 1 << 30


def io_counters() -> dict[str, int]:
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(":") for line in handle)}


def drop_caches(path: Path) -> str:
    """Empty the page cache of `path`'s files: the whole cache as root, else each file's pages."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return "drop_caches"
    except OSError as exc:
        print(f"could not drop the page cache ({exc.strerror}): evicting the files' pages with "
              "posix_fadvise(DONTNEED) instead", file=sys.stderr)
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def timed_verify(path: Path) -> dict[str, Any]:
    """`verify(path)` once, timed, with the process's I/O counters around it (the child's side)."""
    before = io_counters()
    started = time.perf_counter()
    verdict = verify(path)
    seconds = time.perf_counter() - started
    after = io_counters()
    return {"verdict": verdict.fields(), "seconds": seconds,
            **{k: after[k] - before[k] for k in ("rchar", "read_bytes", "syscr")}}


def verify_in_child(path: Path) -> list[dict[str, Any]]:
    """Cold, then warm, in a fresh process (this script with --child) that imports esiwrap.shell.verify
    and nothing heavy, as the supervisor runs it: a process holding torch pays for its larger heap
    in garbage collections."""
    done = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                          check=True)
    found: list[dict[str, Any]] = json.loads(done.stdout)
    return found


def child(path: Path) -> int:
    timings = [timed_verify(path) for _ in range(2)]
    if "torch" in sys.modules:
        sys.exit("verify imported torch")
    print(json.dumps(timings))
    return 0


def tensors(total: int, count: int) -> dict[str, Any]:
    import torch

    numel = total // count // 4
    return {f"layer.{i}.weight": torch.full((numel,), float(i)) for i in range(count)}


def write_torch(path: Path, total: int, count: int) -> Path:
    import torch

    torch.save(tensors(total, count), path / "model.pt")
    return path / "model.pt"


def write_safetensors(path: Path, total: int) -> Path:
    from safetensors.torch import save_file

    save_file(tensors(total, 16), path / "model.safetensors")
    return path / "model.safetensors"


def write_dcp(path: Path, total: int) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(tensors(total, 16), checkpoint_id=str(path / "dcp"), no_dist=True)
    return path / "dcp"


def write_hf_sharded(path: Path, total: int) -> Path:
    from safetensors.torch import save_file

    directory = path / "hf"
    directory.mkdir()
    state, shards, weight_map = tensors(total, 16), 8, {}
    names = sorted(state)
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[k::shards]}
        save_file(part, directory / name)
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


FORMATS: dict[str, Callable[[Path, int], Path]] = {
    "torch": lambda path, total: write_torch(path, total, 16),
    "torch-many": lambda path, total: write_torch(path, total, 4096),
    "safetensors": write_safetensors,
    "dcp": write_dcp,
    "hf-sharded": write_hf_sharded,
}


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def run(directory: Path, total: int) -> list[dict[str, Any]]:
    rows = []
    for name, write in FORMATS.items():
        free = shutil.disk_usage(directory).free
        if free < total * 1.5:
            sys.exit(f"only {size_text(free)} free in {directory}: {size_text(total * 1.5)} needed; use --gb")
        work = directory / name
        work.mkdir()
        started = time.perf_counter()
        path = write(work, total)
        os.sync()
        write_s = time.perf_counter() - started
        how = drop_caches(path)
        cold, warm = verify_in_child(path)
        verdict = cold["verdict"]
        assert verdict["ok"] and warm["verdict"]["ok"], (cold, warm)
        rows.append({"format": name, "verdict": verdict["format"], "files": verdict["files"],
                     "bytes": verdict["bytes"], "write_s": write_s, "cold_s": cold["seconds"],
                     "warm_s": warm["seconds"], "read_bytes": verdict["read_bytes"], "rchar": cold["rchar"],
                     "disk_read": cold["read_bytes"], "syscr": cold["syscr"], "cache": how,
                     "checked": verdict["checked"]})
        print(f"{name}: {verdict['checked']} ({cold['seconds']:.4f} s cold, {warm['seconds']:.4f} s warm)",
              file=sys.stderr)
        shutil.rmtree(work)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| checkpoint | detected as | files | size | save took | verify, cold | verify, warm "
        "| read by verify | share | rchar | read from disk (cold) | read calls |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['format']} | {r['verdict']} | {r['files']} | {size_text(r['bytes'])} "
            f"| {r['write_s']:.1f} s "
            f"| {r['cold_s'] * 1e3:.1f} ms | {r['warm_s'] * 1e3:.2f} ms | {size_text(r['read_bytes'])} "
            f"| {r['read_bytes'] / r['bytes']:.1e} | {size_text(r['rchar'])} | {size_text(r['disk_read'])} "
            f"| {r['syscr']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", help=f"where to write (default: a new directory under "
                                                     f"{DEFAULT_PARENT}, removed afterwards)")
    parser.add_argument("--gb", type=float, default=4.0, help="GiB per checkpoint (default 4)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(Path(args.directory))
    total = int(args.gb * GIB)
    if args.directory:
        directory, made = Path(args.directory), False
        directory.mkdir(parents=True, exist_ok=True)
    else:
        Path(DEFAULT_PARENT).mkdir(parents=True, exist_ok=True)
        directory, made = Path(tempfile.mkdtemp(prefix="run-", dir=DEFAULT_PARENT)), True
    try:
        rows = run(directory, total)
    finally:
        if made:
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(DEFAULT_PARENT)
    caches = {r["cache"] for r in rows}
    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{size_text(total)} per checkpoint in {directory}; cold = after "
          f"{' / '.join(sorted(caches))}; load average {os.getloadavg()[0]:.2f}")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
