"""esiwrap.shell.verify: a checkpoint counts only once its metadata says it is whole.

Every checkpoint here is real: written by torch.save, safetensors, torch.distributed.checkpoint,
a Lightning Trainer, a Hugging Face Trainer and verl's own `_save_checkpoint` (a subprocess:
tests/lib/verl_save_driver.py, system lane). A damaged one is made from a good one the way a save
goes wrong: cut short at some byte, a file missing, a tracker never written or naming another
step, a file still being written.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import PYTHON, ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from esiwrap.shell import verify as verify_module
from esiwrap.shell.verify import CHECKS, Verdict, detect, verify

VERL_DRIVER = ROOT / "tests" / "lib" / "verl_save_driver.py"


def no_wait(seconds: float) -> None:
    """verify's wait between its two measurements of an unknown format, skipped."""


def cut(src: Path, dst: Path, at: int) -> Path:
    """`src`'s first `at` bytes as `dst`: a save stopped there."""
    dst.write_bytes(src.read_bytes()[:at])
    return dst


def rezip(src: Path, dst: Path, drop: str = "", replace: dict[str, bytes] | None = None) -> Path:
    """`src`'s zip entries rewritten to `dst` (stored, as torch writes them), without `drop` and
    with `replace`'s contents."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            if not info.filename.endswith(drop) or not drop:
                new.writestr(info.filename, (replace or {}).get(info.filename, old.read(info)))
    return dst


def entry(path: Path, suffix: str) -> zipfile.ZipInfo:
    with zipfile.ZipFile(path) as archive:
        (found,) = [i for i in archive.infolist() if i.filename.endswith(suffix)]
    return found


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def problem(path: Path, step: int | None = None) -> str:
    verdict = verify(path, step, settle_s=0.0, sleep=no_wait)
    assert not verdict.ok, verdict
    assert verdict.problem and verdict.fix, verdict
    return verdict.problem


# ---------------------------------------------------------------------------------- checkpoints
def small_state_dict() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("made")


@pytest.fixture(scope="module")
def torch_file(made: Path) -> Path:
    import torch

    path = made / "model.pt"
    torch.save(small_state_dict(), path)
    return path


@pytest.fixture(scope="module")
def safetensors_file(made: Path) -> Path:
    from safetensors.torch import save_file

    path = made / "model.safetensors"
    save_file(small_state_dict(), path)
    return path


@pytest.fixture(scope="module")
def dcp_dir(made: Path) -> Path:
    """A DCP save in one process, one storage file per item (`single_file_per_rank=False`)."""
    import torch.distributed.checkpoint as dcp

    path = made / "dcp"
    state = {"model": small_state_dict(), "step": 7}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), single_file_per_rank=False), no_dist=True)
    return path


class _Tiny:
    """A Lightning module, defined once Lightning is imported (only by the fixture that needs it)."""

    @staticmethod
    def make() -> Any:
        import lightning as L
        import torch

        class Tiny(L.LightningModule):
            def __init__(self, width: int = 4) -> None:
                super().__init__()
                self.save_hyperparameters()
                self.layer = torch.nn.Linear(width, 1)

            def training_step(self, batch: Any, index: int) -> Any:
                return self.layer(batch[0]).pow(2).mean()

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Tiny()


@pytest.fixture(scope="module")
def lightning_ckpt(made: Path) -> Path:
    """A real Lightning Trainer fitted for 3 steps, then `trainer.save_checkpoint` (what esiwrap's
    Lightning callback calls): global_step 3."""
    import lightning as L
    import torch

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=made)
    trainer.fit(_Tiny.make(), data)
    path = made / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def hf_run(made: Path) -> Path:
    """A real Hugging Face Trainer, 2 steps of a tiny Llama from a config, saving at step 2:
    output/checkpoint-2 (model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth,
    training_args.bin, trainer_state.json, configs)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    data = [{"input_ids": torch.randint(0, 128, (8,)), "labels": torch.randint(0, 128, (8,))}
            for _ in range(8)]
    args = TrainingArguments(str(made / "output"), max_steps=2, save_steps=2, per_device_train_batch_size=2,
                             report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)
    Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data).train()
    return made / "output" / "checkpoint-2"


@pytest.fixture(scope="module")
def sharded_model(made: Path, hf_run: Path) -> Path:
    """`save_pretrained` of the same model in small shards: model-0000K-of-0000N.safetensors and
    model.safetensors.index.json."""
    from transformers import LlamaForCausalLM

    path = made / "sharded"
    LlamaForCausalLM.from_pretrained(hf_run).save_pretrained(path, max_shard_size="30KB")
    return path


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verl's own `_save_checkpoint`, steps 1 and 2 with max_actor_ckpt_to_keep=1: the run's
    checkpoint root (global_step_1 rotated out, global_step_2 whole, the tracker naming 2)."""
    workdir = tmp_path_factory.mktemp("verl")
    done = subprocess.run([PYTHON, str(VERL_DRIVER), str(workdir)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(json.loads(done.stdout.strip().splitlines()[-1])["root"])


# ---------------------------------------------------------------------------------- the table
def test_every_format_detected_is_checked_and_documented() -> None:
    """Each format `detect` can answer has a check, and the module docstring's two tables name
    every one of them."""
    doc = verify_module.__doc__ or ""
    detection, checks = doc.split("What is checked")
    for name in CHECKS:
        assert re.search(rf"^    {re.escape(name)} ", detection, re.M), name
        assert re.search(rf"^    {re.escape(name)} ", checks, re.M), name
    assert set(re.findall(r"^    ([a-z-]+) ", detection, re.M)) == set(CHECKS)


def test_detection_follows_the_table(tmp_path: Path, torch_file: Path) -> None:
    """A verl root, a verl step directory, an HF checkpoint-N, a DCP directory, any other
    directory; safetensors, Lightning, torch by suffix or zip signature, unknown otherwise."""
    layout = {
        "run/latest_checkpointed_iteration.txt": "3", "run2/global_step_4/data.pt": "",
        "checkpoint-9/x": "", "hf/trainer_state.json": "{}", "dcp/__0_0.distcp": "", "plain/a.txt": "",
        "w.safetensors": "", "l.ckpt": "", "o.pth": "", "blob": "PK\x03\x04", "notes.txt": "hello",
    }
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    expected = {"run": "verl", "run2": "verl", "run2/global_step_4": "verl", "checkpoint-9": "hf-trainer",
                "hf": "hf-trainer", "dcp": "dcp", "plain": "directory", "w.safetensors": "safetensors",
                "l.ckpt": "lightning", "o.pth": "torch", "blob": "torch", "notes.txt": "unknown"}
    assert {name: detect(str(tmp_path / name)) for name in expected} == expected


def test_a_verdict_gives_its_fields_for_a_log_line(torch_file: Path) -> None:
    """`fields()` holds every field of the verdict, seconds rounded to the millisecond."""
    verdict = verify(torch_file)
    fields = verdict.fields()
    assert set(fields) == {"ok", "format", "checked", "problem", "fix", "bytes", "files", "read_bytes",
                           "seconds", "path"}
    assert fields["ok"] is True and fields["format"] == "torch" and fields["problem"] == fields["fix"] == ""
    assert fields["seconds"] == round(verdict.seconds, 3)


def test_a_path_that_is_not_there_fails(tmp_path: Path) -> None:
    """Nothing at the path: not ok, the path named, and a fix that says where to look."""
    verdict = verify(tmp_path / "missing.pt")
    assert not verdict.ok and verdict.problem == "missing.pt: does not exist"
    assert "path the trainer reports" in verdict.fix and verdict.bytes == 0


# ---------------------------------------------------------------------------------- torch.save
def test_a_torch_save_file_passes_reading_its_metadata_only(torch_file: Path) -> None:
    """A torch.save of a state dict: ok; every storage data.pkl names is an entry of its size;
    what was read is the end records, the directory, the local headers and data.pkl."""
    verdict = verify(torch_file)
    assert verdict.ok and verdict.format == "torch", verdict
    assert verdict.checked.startswith("a torch zip of") and "4 storages" in verdict.checked
    assert verdict.files == 1 and verdict.bytes == torch_file.stat().st_size
    with zipfile.ZipFile(torch_file) as archive:
        pickled = next(i.file_size for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    tensor_bytes = sum(t.numel() * t.element_size() for t in small_state_dict().values())
    assert pickled < verdict.read_bytes < verdict.bytes - tensor_bytes


@pytest.mark.parametrize("where", ["first header", "data.pkl", "tensor data", "central directory",
                                   "zip64 record", "end record"])
def test_a_torch_file_cut_short_anywhere_fails(tmp_path: Path, torch_file: Path, where: str) -> None:
    """Cut inside the first local header, data.pkl, a tensor's data, the central directory, the
    zip64 end record or the last record: the end record is not where it must be, and the problem
    says so with the file's size (a file shorter than an end record is too short for a zip)."""
    size = torch_file.stat().st_size
    data = torch_file.read_bytes()
    directory = data.rfind(b"PK\x01\x02")
    at = {"first header": 12, "data.pkl": entry(torch_file, "data.pkl").header_offset + 80,
          "tensor data": entry(torch_file, "data/1").header_offset + 100, "central directory": directory + 30,
          "zip64 record": data.rfind(b"PK\x06\x06") + 20, "end record": size - 5}[where]
    message = problem(cut(torch_file, tmp_path / "model.pt", at))
    if at < 22:
        assert message == f"model.pt: {at} bytes: too short to be a zip (its end record alone is 22)"
    else:
        assert message == (f"model.pt: no end-of-central-directory record at the end of its {at} bytes: the "
                           "file is cut short (or is not a zip)")


def state_dicts() -> st.SearchStrategy[dict[str, tuple[str, list[int]]]]:
    dtypes = st.sampled_from(["float32", "float16", "bfloat16", "int64", "uint8", "bool", "float64"])
    shapes = st.lists(st.integers(0, 5), max_size=3)
    return st.dictionaries(st.text("abcdefgh._", min_size=1, max_size=6), st.tuples(dtypes, shapes),
                           min_size=1, max_size=4)


def tensors(spec: dict[str, tuple[str, list[int]]]) -> dict[str, Any]:
    import torch

    return {name: torch.ones(shape, dtype=getattr(torch, dtype)) for name, (dtype, shape) in spec.items()}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scratch")


@settings(max_examples=150)
@given(spec=state_dicts(), data=st.data())
def test_a_torch_file_cut_at_any_byte_is_caught(scratch: Path, spec: dict[str, tuple[str, list[int]]],
                                                data: st.DataObject) -> None:
    """For any state dict of tensors (dtypes, shapes, empty ones too), the whole torch.save file
    passes and the file cut at any byte fails."""
    import torch

    buffer = io.BytesIO()
    torch.save(tensors(spec), buffer)
    whole = buffer.getvalue()
    path = scratch / "any.pt"
    path.write_bytes(whole)
    assert verify(path).ok
    at = data.draw(st.integers(0, len(whole) - 1), label="cut at")
    path.write_bytes(whole[:at])
    verdict = verify(path)
    assert not verdict.ok and verdict.problem.startswith("any.pt: ")


def test_bytes_missing_from_the_middle_of_a_torch_file_are_named(tmp_path: Path, torch_file: Path) -> None:
    """Ten bytes of a tensor gone, the end intact: the zip64 locator points 10 bytes past its
    record, and the problem says so with both offsets."""
    data = torch_file.read_bytes()
    at = entry(torch_file, "data/0").header_offset + 200
    (tmp_path / "model.pt").write_bytes(data[:at] + data[at + 10:])
    locator, record = len(data) - 10 - 42, data.rfind(b"PK\x06\x06")
    assert problem(tmp_path / "model.pt") == (
        f"model.pt: the zip64 locator at offset {locator} points to offset {record}, where there is no zip64 "
        f"end record: it is at offset {record - 10}, so 10 bytes are missing from the file before it")


def test_a_zip_whose_directory_is_not_before_its_end_record_is_named(tmp_path: Path,
                                                                      torch_file: Path) -> None:
    """A plain zip (no zip64 records) with ten bytes gone from its middle: the central directory
    no longer ends where the end record begins, and the problem gives the offsets."""
    plain = rezip(torch_file, tmp_path / "plain.pt")
    data = plain.read_bytes()
    plain.write_bytes(data[:300] + data[310:])
    assert re.fullmatch(r"plain\.pt: the central directory \(\d+ bytes at offset \d+\) does not end where "
                        r"the end records begin \(offset \d+\): bytes are missing from, or were added to, "
                        r"the middle of the file", problem(plain))


def test_a_damaged_local_header_is_named_with_its_offset(tmp_path: Path, torch_file: Path) -> None:
    """An entry's local header overwritten: the problem names the entry and the offset where its
    header should be."""
    data = bytearray(torch_file.read_bytes())
    info = entry(torch_file, "data/2")
    data[info.header_offset:info.header_offset + 4] = b"\0\0\0\0"
    (tmp_path / "model.pt").write_bytes(bytes(data))
    assert problem(tmp_path / "model.pt") == (
        f"model.pt: entry {info.filename}: no local header at offset {info.header_offset} "
        f"(the central directory starts at {cd_offset(data)})")


def cd_offset(data: bytes | bytearray) -> int:
    """Where a torch file's central directory starts (its zip64 end record says)."""
    at = bytes(data).rfind(b"PK\x06\x06")
    return int(struct.unpack_from("<Q", data, at + 48)[0])


def central_record(data: bytes | bytearray, name: str) -> int:
    """The offset of `name`'s central directory record."""
    at = cd_offset(data)
    while data[at + 46:at + 46 + len(name)] != name.encode():
        n, m, k = struct.unpack_from("<3H", data, at + 28)
        at += 46 + n + m + k
    return at


def test_an_entry_whose_data_runs_into_the_next_is_named(tmp_path: Path, torch_file: Path) -> None:
    """An entry's compressed size grown in the central directory: its data would run past the
    next entry's header, and the problem gives its size, its offset and that boundary."""
    data = bytearray(torch_file.read_bytes())
    info = entry(torch_file, "data/0")
    struct.pack_into("<I", data, central_record(data, info.filename) + 20, info.compress_size + 4096)
    (tmp_path / "model.pt").write_bytes(bytes(data))
    assert re.fullmatch(rf"model\.pt: entry {re.escape(info.filename)}: its {info.compress_size + 4096} "
                        r"bytes at offset \d+ run past offset \d+, where the next entry \(or the central "
                        r"directory\) begins", problem(tmp_path / "model.pt"))


def test_a_storage_data_pkl_names_must_be_in_the_archive_at_its_size(tmp_path: Path,
                                                                     torch_file: Path) -> None:
    """Rewritten without the entry of storage 1, or with storage 0 shorter than data.pkl says:
    each problem names the storage, the entry and the sizes."""
    prefix = entry(torch_file, "data.pkl").filename.split("/")[0]
    assert problem(rezip(torch_file, tmp_path / "model.pt", drop="/data/1")) == (
        f"model.pt: data.pkl names storage 1, and there is no entry {prefix}/data/1")
    size = entry(torch_file, "data/0").file_size
    short = rezip(torch_file, tmp_path / "short.pt", replace={f"{prefix}/data/0": b"\0" * (size - 4)})
    assert problem(short) == (f"short.pt: entry {prefix}/data/0 holds {size - 4} bytes; data.pkl gives that "
                              f"storage {size}")


def test_a_zip_without_data_pkl_is_not_a_torch_file(tmp_path: Path, torch_file: Path) -> None:
    """A whole zip whose data.pkl is gone: not a torch.save file, and the fix says the name lies."""
    path = rezip(torch_file, tmp_path / "model.pt", drop="/data.pkl")
    verdict = verify(path)
    assert verdict.problem == "model.pt: a zip without a <archive>/data.pkl entry: not a torch.save file"
    assert "not the format its name says" in verdict.fix


def test_a_damaged_data_pkl_is_caught_without_running_it(tmp_path: Path, torch_file: Path) -> None:
    """data.pkl cut in half (same length, zeros after): it does not unpickle, and nothing in it
    runs (the stand-ins record calls)."""
    name = entry(torch_file, "data.pkl").filename
    with zipfile.ZipFile(torch_file) as archive:
        pickled = archive.read(name)
    half = pickled[: len(pickled) // 2] + b"\0" * (len(pickled) - len(pickled) // 2)
    message = problem(rezip(torch_file, tmp_path / "model.pt", replace={name: half}))
    assert message.startswith(f"model.pt: {name}: does not unpickle (")


def test_a_legacy_torch_file_is_checked_for_existence_and_size_only(tmp_path: Path) -> None:
    """torch.save's pre-1.6 format (a pickle stream): ok, saying it cannot be checked beyond its
    existence and a size that stays the same."""
    import torch

    path = tmp_path / "old.pt"
    torch.save(small_state_dict(), path, _use_new_zipfile_serialization=False)
    verdict = verify(path, settle_s=0.0, sleep=no_wait)
    assert verdict.ok and verdict.format == "torch"
    assert verdict.checked.startswith("a pickle (legacy torch.save, before 1.6): not checkable beyond "
                                      "existence and size; ")
    assert "unchanged over 0 s" in verdict.checked


@pytest.mark.parametrize("name", ["empty.pt", "empty.safetensors", "empty.ckpt", "empty.bin", "empty.dat"])
def test_an_empty_file_fails(tmp_path: Path, name: str) -> None:
    """A file of 0 bytes, of any format: not ok, it is empty, and the fix says nothing was
    written."""
    (tmp_path / name).write_bytes(b"")
    verdict = verify(tmp_path / name, settle_s=0.0, sleep=no_wait)
    assert not verdict.ok
    assert verdict.problem in (f"{name}: empty (0 bytes)",
                               f"{name}: 0 bytes: too short for the 8-byte header length")


# ---------------------------------------------------------------------------------- safetensors
def test_a_safetensors_file_passes_reading_its_header_only(safetensors_file: Path) -> None:
    """safetensors: ok, the tensors counted, and only the length and the header read."""
    verdict = verify(safetensors_file)
    assert verdict.ok and verdict.format == "safetensors", verdict
    header = int.from_bytes(safetensors_file.read_bytes()[:8], "little")
    assert verdict.checked.startswith("safetensors: 4 tensors in ") and verdict.read_bytes == 8 + header


def test_a_safetensors_file_cut_short_fails_precisely(tmp_path: Path, safetensors_file: Path) -> None:
    """Cut in the length, in the header, in the data: each problem says where, with the offsets."""
    header = int.from_bytes(safetensors_file.read_bytes()[:8], "little")
    size = safetensors_file.stat().st_size
    path = tmp_path / "model.safetensors"
    assert problem(cut(safetensors_file, path, 5)) == (
        "model.safetensors: 5 bytes: too short for the 8-byte header length")
    assert problem(cut(safetensors_file, path, 8 + header // 2)) == (
        f"model.safetensors: the header length (first 8 bytes) is {header}, and {header // 2} bytes follow: "
        "the file is cut short inside its header")
    message = problem(cut(safetensors_file, path, size - 10))
    assert re.fullmatch(rf"model\.safetensors: tensor '[\w.]+' ends at byte {size} \(data_offsets end "
                        rf"{size - 8 - header}\), and the file is {size - 10} bytes: the file is cut short",
                        message)


@settings(max_examples=150)
@given(spec=state_dicts(), data=st.data())
def test_a_safetensors_file_cut_at_any_byte_is_caught(scratch: Path, spec: dict[str, tuple[str, list[int]]],
                                                      data: st.DataObject) -> None:
    """For any set of tensors (dtypes, shapes, empty ones too), the whole safetensors file passes
    and the file cut at any byte fails."""
    from safetensors.torch import save

    whole = save(tensors(spec))
    path = scratch / "any.safetensors"
    path.write_bytes(whole)
    assert verify(path).ok
    path.write_bytes(whole[: data.draw(st.integers(0, len(whole) - 1), label="cut at")])
    assert not verify(path).ok


def handmade_safetensors(path: Path, header: dict[str, Any], data_bytes: int) -> Path:
    """A safetensors file written by hand as the format says: length, JSON header, data."""
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * data_bytes)
    return path


def test_a_safetensors_header_must_match_its_data(tmp_path: Path) -> None:
    """A tensor whose dtype x shape is not its byte range, a gap, an overlap, and bytes after
    the last tensor: each problem names the tensor and the offsets."""
    path = tmp_path / "w.safetensors"
    a = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    assert problem(handmade_safetensors(path, {"a": {**a, "shape": [2, 3]}}, 16)) == (
        "w.safetensors: tensor 'a': F32 [2, 3] is 24 bytes, and its data_offsets [0, 16] hold 16")
    b_gap = {"dtype": "U8", "shape": [4], "data_offsets": [20, 24]}
    assert problem(handmade_safetensors(path, {"a": a, "b": b_gap}, 24)) == (
        "w.safetensors: tensor 'b' starts at data offset 20, after 'a' ends at 16: a gap of 4 bytes")
    b_overlap = {"dtype": "U8", "shape": [4], "data_offsets": [12, 16]}
    assert problem(handmade_safetensors(path, {"a": a, "b": b_overlap}, 16)) == (
        "w.safetensors: tensor 'b' starts at data offset 12, after 'a' ends at 16: an overlap of 4 bytes")
    assert problem(handmade_safetensors(path, {"a": a}, 20)) == (
        "w.safetensors: 4 bytes follow the last tensor (the tensors end at data offset 16, the data "
        "section is 20 bytes)")
    assert verify(handmade_safetensors(path, {"a": a, "__metadata__": {"format": "pt"}}, 16)).ok


# ---------------------------------------------------------------------------------- DCP
def test_a_dcp_directory_passes_without_reading_the_data(dcp_dir: Path) -> None:
    """torch.distributed.checkpoint.save in one process: ok; .metadata read with stand-ins, every
    storage file it names there and long enough; only .metadata was read."""
    verdict = verify(dcp_dir)
    assert verdict.ok and verdict.format == "dcp", verdict
    assert re.fullmatch(r"DCP: \.metadata places 5 items in 5 storage files, each there and long enough",
                        verdict.checked), verdict.checked
    assert verdict.read_bytes == (dcp_dir / ".metadata").stat().st_size


def test_a_dcp_directory_without_metadata_did_not_finish(tmp_path: Path, dcp_dir: Path) -> None:
    """No .metadata: the save did not finish (it is written last); .metadata.tmp alone: it
    stopped while writing it."""
    path = copy(dcp_dir, tmp_path)
    (path / ".metadata").rename(path / ".metadata.tmp")
    assert problem(path) == ("dcp: .metadata.tmp and no .metadata: the save stopped while writing its "
                             "metadata (written last)")
    (path / ".metadata.tmp").unlink()
    assert problem(path) == "dcp/.metadata is missing: the save did not finish (.metadata is written last)"


def test_a_dcp_storage_file_missing_or_short_is_named(tmp_path: Path, dcp_dir: Path) -> None:
    """A storage file .metadata names is gone, or shorter than its last item's end: the problem
    names the file and, when short, the item and the byte it should reach."""
    path = copy(dcp_dir, tmp_path)
    storage = sorted(path.glob("*.distcp"))
    storage[0].unlink()
    assert problem(path) == f"dcp/{storage[0].name} is missing; .metadata places 1 item in it"
    path = copy(dcp_dir, tmp_path / "again")
    size = (path / storage[1].name).stat().st_size
    cut(path / storage[1].name, path / storage[1].name, size - 3)
    assert re.fullmatch(rf"dcp/{storage[1].name} is {size - 3} bytes; \.metadata places '[\w.]+' in it up to "
                        rf"byte {size}: the file is cut short", problem(path))


def test_a_damaged_dcp_metadata_fails(tmp_path: Path, dcp_dir: Path) -> None:
    """.metadata cut in half: it does not unpickle."""
    path = copy(dcp_dir, tmp_path)
    cut(path / ".metadata", path / ".metadata", (path / ".metadata").stat().st_size // 2)
    assert problem(path).startswith("dcp/.metadata: does not unpickle (")


def test_a_dcp_metadata_in_an_unknown_layout_counts_by_presence(tmp_path: Path, dcp_dir: Path) -> None:
    """A .metadata that neither the stand-ins nor torch read as DCP metadata (a pickle of
    something else): ok on its presence and size, and the verdict says the storage files went
    unchecked."""
    import pickle

    path = copy(dcp_dir, tmp_path)
    (path / ".metadata").write_bytes(pickle.dumps({"version": "9.9"}))
    verdict = verify(path)
    assert verdict.ok and "in a layout esiwrap cannot read (and torch could not): storage files not " \
        "checked" in verdict.checked


# ---------------------------------------------------------------------------------- Lightning
def test_a_lightning_checkpoint_passes_with_its_step(lightning_ckpt: Path) -> None:
    """A Lightning Trainer's checkpoint: a torch zip whose data.pkl holds state_dict, epoch and
    global_step, the step the trainer reported (3)."""
    verdict = verify(lightning_ckpt, 3)
    assert verdict.ok and verdict.format == "lightning", verdict
    assert re.search(r"; Lightning [\d.]+: epoch \d+, global_step 3$", verdict.checked), verdict.checked


def test_a_lightning_checkpoint_of_another_step_fails(lightning_ckpt: Path) -> None:
    """The trainer reported step 5 and the file holds global_step 3: another save's file (a
    rename that did not happen)."""
    verdict = verify(lightning_ckpt, 5)
    assert verdict.problem == "last.ckpt: global_step 3, and the trainer reported saving step 5"
    assert "rename that did not happen" in verdict.fix


def test_a_lightning_checkpoint_cut_short_fails(tmp_path: Path, lightning_ckpt: Path) -> None:
    """A Lightning checkpoint cut in its middle fails as a torch zip does."""
    at = lightning_ckpt.stat().st_size // 2
    assert problem(cut(lightning_ckpt, tmp_path / "last.ckpt", at)).startswith(
        f"last.ckpt: no end-of-central-directory record at the end of its {at} bytes")


def test_a_ckpt_that_is_not_lightnings_is_checked_as_torch(tmp_path: Path) -> None:
    """A `.ckpt` written by plain torch.save (no pytorch-lightning_version): ok, as a torch file."""
    import torch

    torch.save({"model": small_state_dict(), "step": 1}, tmp_path / "plain.ckpt")
    verdict = verify(tmp_path / "plain.ckpt")
    assert verdict.ok and verdict.format == "torch"
    assert verdict.checked.endswith("no pytorch-lightning_version in data.pkl: checked as torch")


# ---------------------------------------------------------------------------------- HF Trainer
def test_a_hugging_face_trainer_checkpoint_passes(hf_run: Path) -> None:
    """A real Trainer's checkpoint-2: trainer_state.json says global_step 2, the weights are
    there, and every file is checked by its kind (torch zips: optimizer, scheduler, RNG state,
    training args) reading a small share of the bytes."""
    verdict = verify(hf_run, 2)
    assert verdict.ok and verdict.format == "hf-trainer", verdict
    assert verdict.checked.startswith("hf-trainer: global_step 2, weights model.safetensors; ")
    assert "4 torch zips" in verdict.checked and "1 safetensors file" in verdict.checked
    assert verdict.read_bytes < verdict.bytes / 4


def test_a_trainer_checkpoint_without_trainer_state_did_not_finish(tmp_path: Path, hf_run: Path) -> None:
    """trainer_state.json missing: the Trainer writes it last, so the save did not finish; cut:
    not JSON, with the byte where it stops."""
    path = copy(hf_run, tmp_path)
    state = (path / "trainer_state.json").read_bytes()
    cut(path / "trainer_state.json", path / "trainer_state.json", len(state) - 20)
    assert re.fullmatch(rf"checkpoint-2/trainer_state\.json: not JSON \(.+ at byte \d+ of "
                        rf"{len(state) - 20}\): cut short or damaged", problem(path))
    (path / "trainer_state.json").unlink()
    assert problem(path) == ("checkpoint-2/trainer_state.json is missing: the Trainer writes it last, after "
                             "the weights, optimizer, scheduler and RNG state, so the save did not finish")


def test_a_trainer_checkpoint_of_another_step_fails(tmp_path: Path, hf_run: Path) -> None:
    """The step reported is not trainer_state.json's global_step; nor is the directory's N."""
    assert problem(hf_run, 3) == "checkpoint-2: global_step 2, and the trainer reported saving step 3"
    renamed = tmp_path / "checkpoint-4"
    shutil.copytree(hf_run, renamed)
    assert problem(renamed) == "checkpoint-4/trainer_state.json: global_step 2, not the directory's 4"


def test_a_cut_file_inside_a_trainer_checkpoint_is_named(tmp_path: Path, hf_run: Path) -> None:
    """optimizer.pt cut short inside an otherwise whole checkpoint-2: the problem names it."""
    path = copy(hf_run, tmp_path)
    size = (path / "optimizer.pt").stat().st_size
    cut(path / "optimizer.pt", path / "optimizer.pt", size - 100)
    assert problem(path).startswith(f"checkpoint-2/optimizer.pt: no end-of-central-directory record at the "
                                    f"end of its {size - 100} bytes")


def test_a_trainer_checkpoint_without_weights_fails(tmp_path: Path, hf_run: Path) -> None:
    """model.safetensors gone (nothing else holds the weights): not ok, it says which names
    were looked for; DeepSpeed's global_stepN/ in their place (its model states a torch zip): ok."""
    import torch

    path = copy(hf_run, tmp_path)
    (path / "model.safetensors").unlink()
    assert problem(path).startswith("checkpoint-2: no model weights (model.safetensors, pytorch_model.bin")
    (path / "global_step2").mkdir()
    torch.save({"module": small_state_dict()}, path / "global_step2" / "mp_rank_00_model_states.pt")
    (path / "latest").write_text("global_step2")
    verdict = verify(path, 2)
    assert verdict.ok and "weights global_step2; " in verdict.checked, verdict


def test_sharded_weights_must_match_their_index(tmp_path: Path, sharded_model: Path) -> None:
    """save_pretrained's shards and index: ok as a directory; a shard missing, a tensor the index
    puts in a shard that does not hold it, or (in a Trainer checkpoint) shards without their
    index fail, naming the file and the tensor."""
    verdict = verify(sharded_model)
    shards = sorted(sharded_model.glob("model-*.safetensors"))
    assert verdict.ok and verdict.format == "directory" and len(shards) >= 2
    assert f"{len(shards)} safetensors files" in verdict.checked and "1 weight map" in verdict.checked
    path = copy(sharded_model, tmp_path)
    (path / shards[-1].name).unlink()
    assert problem(path) == (f"sharded/model.safetensors.index.json: its weight_map names {shards[-1].name}, "
                             "which is missing")
    path = copy(sharded_model, tmp_path / "again")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    tensor, shard = next(iter(index["weight_map"].items()))
    other = next(s.name for s in shards if s.name != shard)
    index["weight_map"][tensor] = other
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert problem(path) == (f"sharded/model.safetensors.index.json: its weight_map puts {tensor!r} in "
                             f"{other}, which does not hold it")
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(sharded_model, checkpoint)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    (checkpoint / "model.safetensors.index.json").unlink()
    assert problem(checkpoint) == (f"checkpoint-2: {shards[0].name} is there and "
                                   "model.safetensors.index.json is not: save_pretrained writes the index "
                                   "after the shards")


# ---------------------------------------------------------------------------------- verl
@pytest.mark.system
def test_a_verl_checkpoint_passes(verl_run: Path) -> None:
    """verl's own save: the run's root (the tracker names 2) and global_step_2 itself pass; the
    actor's FSDP shards are torch zips; bytes and files are global_step_2's, and a small share
    of them was read."""
    for path in (verl_run, verl_run / "global_step_2"):
        verdict = verify(path, 2)
        assert verdict.ok and verdict.format == "verl", verdict
        assert verdict.checked.startswith("verl: latest_checkpointed_iteration.txt names step 2; actor/: "
                                          "FSDP model+optim+extra_state shards of 1 rank; ")
        step_files = [f for f in (verl_run / "global_step_2").rglob("*") if f.is_file()]
        assert verdict.bytes == sum(f.stat().st_size for f in step_files)
        assert verdict.read_bytes < verdict.bytes / 10


@pytest.mark.system
def test_a_verl_step_rotated_out_is_not_a_checkpoint(verl_run: Path) -> None:
    """global_step_1 after verl's rotation (max_actor_ckpt_to_keep=1): its actor/ is gone and its
    data.pt left, the tracker names 2; the fix names the rotation setting."""
    verdict = verify(verl_run / "global_step_1")
    assert verdict.problem == ("ckpt/latest_checkpointed_iteration.txt names step 2, a later save: verl "
                               "resumes from that one, not from step 1; this step's actor/ is gone and its "
                               "data.pt left: rotated out")
    assert "max_actor_ckpt_to_keep" in verdict.fix


@pytest.mark.system
def test_a_verl_checkpoint_whose_tracker_is_missing_or_behind_did_not_finish(tmp_path: Path,
                                                                           verl_run: Path) -> None:
    """No tracker: the step directory is not a checkpoint yet (verl writes the tracker last);
    a tracker still naming step 1: the save of step 2 did not finish; asked for step 3 while
    the tracker names 2: another save's."""
    root = copy(verl_run, tmp_path)
    tracker = root / "latest_checkpointed_iteration.txt"
    assert problem(root, 3) == ("ckpt/global_step_3 is missing; ckpt/latest_checkpointed_iteration.txt names "
                                "step 2")
    assert problem(root / "global_step_2", 3) == ("ckpt/global_step_2: step 2, and the trainer reported "
                                                  "saving step 3")
    tracker.write_text("1")
    verdict = verify(root / "global_step_2")
    assert verdict.problem == ("ckpt/latest_checkpointed_iteration.txt names step 1, not 2: the save of "
                               "step 2 did not finish (verl writes the tracker last)")
    assert "verl writes latest_checkpointed_iteration.txt last" in verdict.fix
    tracker.unlink()
    assert problem(root / "global_step_2") == ("ckpt/latest_checkpointed_iteration.txt is missing: verl "
                                               "writes it last, after ckpt/global_step_2/")
    assert problem(root, 2) == ("ckpt/latest_checkpointed_iteration.txt is missing: verl writes it last, "
                                "after ckpt/global_step_2/")
    assert problem(root) == "ckpt/latest_checkpointed_iteration.txt is missing (newest: global_step_2)"


@pytest.mark.system
def test_a_verl_rank_shard_missing_or_cut_is_named(tmp_path: Path, verl_run: Path) -> None:
    """The same save as two ranks would write it (each rank's shards, fsdp_config.json's world
    size 2): whole, it passes; rank 1's model shard missing: named, with how many ranks' are there
    and a fix about storage every node shares; a shard cut short: named."""
    root = copy(verl_run, tmp_path)
    actor = root / "global_step_2" / "actor"
    for kind in ("model", "optim", "extra_state"):
        shard = actor / f"{kind}_world_size_1_rank_0.pt"
        for rank in (0, 1):
            shutil.copyfile(shard, actor / f"{kind}_world_size_2_rank_{rank}.pt")
        shard.unlink()
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
    verdict = verify(root, 2)
    assert verdict.ok and "shards of 2 ranks" in verdict.checked, verdict
    (actor / "model_world_size_2_rank_1.pt").unlink()
    verdict = verify(root, 2)
    assert verdict.problem == ("ckpt/global_step_2/actor/model_world_size_2_rank_1.pt is missing (1 of 2 "
                               "ranks' model shards are there)")
    assert "storage every node" in verdict.fix
    shutil.copyfile(actor / "model_world_size_2_rank_0.pt", actor / "model_world_size_2_rank_1.pt")
    size = (actor / "optim_world_size_2_rank_1.pt").stat().st_size
    cut(actor / "optim_world_size_2_rank_1.pt", actor / "optim_world_size_2_rank_1.pt", size // 3)
    assert problem(root, 2).startswith(f"ckpt/global_step_2/actor/optim_world_size_2_rank_1.pt: no end-of-"
                                       f"central-directory record at the end of its {size // 3} bytes")


@pytest.mark.system
def test_a_verl_save_stopped_before_its_last_files_did_not_finish(tmp_path: Path, verl_run: Path) -> None:
    """fsdp_config.json (rank 0's last file) or data.pt (written before the tracker) missing: the
    save did not finish, each named."""
    root = copy(verl_run, tmp_path)
    (root / "global_step_2" / "data.pt").unlink()
    assert problem(root, 2) == ("ckpt/global_step_2/data.pt is missing: verl writes it after actor/ and "
                                "critic/, before the tracker")
    (root / "global_step_2" / "actor" / "fsdp_config.json").unlink()
    assert problem(root, 2) == ("ckpt/global_step_2/actor/fsdp_config.json is missing: rank 0 writes it "
                                "after its shards, so the save did not finish")


def test_a_megatron_async_save_without_its_tracker_names_async_save(tmp_path: Path) -> None:
    """verl's Megatron layout (model/, optimizer/, extra/ dist_ckpt DCP dirs, ckpt_contents.json
    last) with no tracker, as async_save leaves it: the fix names async_save and what to do; with
    the tracker but without ckpt_contents.json: the async write did not finish; whole: ok."""
    import torch.distributed.checkpoint as dcp

    step_dir = tmp_path / "ckpt" / "global_step_5"
    actor = step_dir / "actor"
    for part in ("model", "optimizer", "extra"):
        dcp.save({part: small_state_dict()}, checkpoint_id=str(actor / part / "dist_ckpt"), no_dist=True)
    (actor / "ckpt_contents.json").write_text(json.dumps({"global_step": 5}))
    (actor / "transformer_config.json").write_text("{}")
    import torch

    torch.save({"dataloader": 5}, step_dir / "data.pt")
    verdict = verify(step_dir, 5)
    assert verdict.problem == ("ckpt/latest_checkpointed_iteration.txt is missing: verl writes it last, "
                               "after ckpt/global_step_5/")
    assert "async_save=True" in verdict.fix and "resume_from_path" in verdict.fix
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("5")
    verdict = verify(step_dir, 5)
    assert verdict.ok, verdict
    assert "actor/: Megatron, ckpt_contents.json and 3 dist_ckpt dirs" in verdict.checked
    (actor / "ckpt_contents.json").unlink()
    assert problem(step_dir, 5) == ("ckpt/global_step_5/actor/ckpt_contents.json is missing: verl's Megatron "
                                    "save writes it last (after an async write completes), so the save did "
                                    "not finish")


# ---------------------------------------------------------------------------------- mixed and unknown
def test_a_directory_of_several_formats_reports_its_first_problem(tmp_path: Path, safetensors_file: Path,
                                                                  torch_file: Path) -> None:
    """A directory holding model.safetensors and optimizer.pt: ok with both checked; with
    optimizer.pt cut short, the problem is optimizer.pt's."""
    path = tmp_path / "save"
    path.mkdir()
    shutil.copyfile(safetensors_file, path / "model.safetensors")
    shutil.copyfile(torch_file, path / "optimizer.pt")
    (path / "notes.txt").write_text("step 9")
    verdict = verify(path)
    assert verdict.ok and verdict.format == "directory"
    assert verdict.checked == "1 safetensors file, 1 torch zip; 1 other file not checked"
    size = torch_file.stat().st_size
    cut(torch_file, path / "optimizer.pt", size - 1)
    assert problem(path).startswith(f"save/optimizer.pt: no end-of-central-directory record at the end of "
                                    f"its {size - 1} bytes")


def test_an_unknown_format_passes_once_its_size_settles(tmp_path: Path) -> None:
    """A file and a directory esiwrap does not know: ok when they hold bytes that do not change
    over settle_s, measured twice; the verdict says the contents were not checked."""
    (tmp_path / "state.msgpack").write_bytes(b"\x81" * 100)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.npy").write_bytes(b"x" * 10)
    (tmp_path / "dir" / "b.npy").write_bytes(b"y" * 20)
    waits: list[float] = []
    verdict = verify(tmp_path / "state.msgpack", settle_s=0.25, sleep=waits.append)
    assert verdict.ok and verdict.format == "unknown" and waits == [0.25]
    assert verdict.checked == ("100 bytes in 1 file, unchanged over 0.25 s; format not recognised: contents "
                               "not checked")
    verdict = verify(tmp_path / "dir", settle_s=0.25, sleep=no_wait)
    assert verdict.ok and verdict.format == "unknown" and verdict.checked.startswith("30 bytes in 2 files")


def test_an_empty_directory_fails(tmp_path: Path) -> None:
    """A directory with nothing, or only empty files, in it: not ok."""
    (tmp_path / "ckpt").mkdir()
    assert problem(tmp_path / "ckpt") == "ckpt: an empty directory"
    (tmp_path / "ckpt" / "shard.raw").write_bytes(b"")
    assert problem(tmp_path / "ckpt") == "ckpt: 1 file, all empty"


@pytest.fixture
def growing(tmp_path: Path) -> Iterator[tuple[Path, threading.Event]]:
    """A file another thread keeps appending to (every few ms) until the test ends; the event is
    set after each append."""
    path = tmp_path / "blob.raw"
    path.write_bytes(b"x" * 1000)
    appended, stop = threading.Event(), threading.Event()

    def append() -> None:
        with open(path, "ab") as handle:
            while not stop.is_set():
                handle.write(b"y" * 100)
                handle.flush()
                appended.set()
                stop.wait(0.002)

    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    yield path, appended
    stop.set()
    writer.join()


def test_a_file_still_being_written_fails(growing: tuple[Path, threading.Event]) -> None:
    """A file a thread appends to while verify waits between its two measurements: still being
    written, with both sizes; the fix says the save was reported ended too early."""
    path, appended = growing

    def sleep(seconds: float) -> None:  # the wait: until the file has grown past its size now
        # (an append signals after its flush: the size verify saw may already include it)
        before = path.stat().st_size
        while path.stat().st_size <= before:
            appended.clear()
            assert appended.wait(10)

    verdict = verify(path, settle_s=0.5, sleep=sleep)
    found = re.fullmatch(r"blob\.raw: still being written: (\d+) bytes in 1 file, then (\d+) bytes in 1 file "
                         r"0\.5 s later", verdict.problem)
    assert found and int(found[2]) > int(found[1]) >= 1000, verdict.problem
    assert "esi.saving()" in verdict.fix


def test_verify_never_raises(tmp_path: Path) -> None:
    """Paths that are neither a file nor a directory, or a file with a name no format knows and
    bytes no format reads: a verdict, never an exception."""
    os.mkfifo(tmp_path / "pipe.pt")
    verdict = verify(tmp_path / "pipe.pt")
    assert isinstance(verdict, Verdict) and not verdict.ok
    assert verdict.problem == "pipe.pt: neither a regular file nor a directory"


@pytest.mark.system
def test_verify_reads_every_format_without_importing_torch(torch_file: Path, safetensors_file: Path,
                                                           dcp_dir: Path, lightning_ckpt: Path) -> None:
    """In a fresh process: torch.save zips, safetensors, a DCP directory and a Lightning
    checkpoint are all checked, and torch is never imported."""
    paths = [str(torch_file), str(safetensors_file), str(dcp_dir), str(lightning_ckpt)]
    script = ("import sys; from esiwrap.shell.verify import verify; "
              f"v = [verify(p) for p in {paths!r}]; "
              "assert all(x.ok for x in v), v; assert 'torch' not in sys.modules; print('ok')")
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.system
def test_without_torch_an_unreadable_dcp_metadata_counts_by_presence(tmp_path: Path, dcp_dir: Path) -> None:
    """In a process where torch cannot be imported, a DCP directory whose .metadata the
    stand-ins cannot read as DCP metadata: ok on its presence and size, and it says so."""
    import pickle

    path = copy(dcp_dir, tmp_path)
    (path / ".metadata").write_bytes(pickle.dumps({"version": "9.9"}))
    script = ("import sys; sys.modules['torch'] = None; from esiwrap.shell.verify import verify; "
              f"v = verify({str(path)!r}); assert v.ok, v; print(v.checked)")
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip().startswith("DCP: .metadata ("), done.stderr
    assert "storage files not checked" in done.stdout
