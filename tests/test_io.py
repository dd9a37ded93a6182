import json

import pytest
import torch

from rankwise.core.io import (
    atomic_dir, atomic_path, load_tensors, read_versioned_config, save_tensors_atomic, verify_manifest,
    write_json_atomic, write_manifest, write_versioned_config,
)
from rankwise.errors import CorruptFileError


def test_atomic_path_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_atomic_dir_replaces_whole_folder(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "stale.txt").write_text("x")
    with atomic_dir(folder) as tmp:
        (tmp / "new.txt").write_text("y")
    assert sorted(p.name for p in folder.iterdir()) == ["new.txt"]


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
