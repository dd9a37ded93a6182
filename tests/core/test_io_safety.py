"""Issue 17, items 1-2: the one folder writer never loses the user's files, never mixes kinds, follows the umask."""

import os
import stat
import subprocess
import sys

import pytest
import torch

from rankwise.core import io
from rankwise.core.io import MANIFEST_NAME, save_model_folder, save_tensors_atomic, write_json_atomic, write_text_atomic
from rankwise.errors import InvalidInputError


def _weights(tmp):
    save_tensors_atomic(tmp / "w.safetensors", {"w": torch.ones(3)})


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def umask():
    """Set a umask for the test and restore the caller's afterwards."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def test_a_folder_of_another_kind_is_refused_unless_overwrite(tmp_path):
    out = save_model_folder(tmp_path / "out", _weights, format_name="rankwise-quantized")
    before = (out / "w.safetensors").read_bytes()
    with pytest.raises(InvalidInputError, match=r"holds a rankwise 'rankwise-quantized' folder, not a 'adapter' one.*--overwrite"):
        save_model_folder(out, _weights, kind="adapter")
    assert (out / "w.safetensors").read_bytes() == before
    save_model_folder(out, lambda tmp: (tmp / "a.bin").write_bytes(b"1"), kind="adapter", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(["a.bin", MANIFEST_NAME])
    save_model_folder(out, _weights, kind="adapter")  # the same kind replaces it without being asked
    assert io.read_json(out / MANIFEST_NAME)["rankwise_kind"] == "adapter"


def test_a_users_folder_is_replaced_only_with_overwrite(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(InvalidInputError, match="not written by rankwise.*--overwrite"):
        save_model_folder(mine, _weights)
    assert (mine / "notes.txt").read_text() == "precious"
    save_model_folder(mine, _weights, overwrite=True)  # the user's explicit consent
    assert sorted(p.name for p in mine.iterdir()) == sorted([MANIFEST_NAME, "w.safetensors"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_an_existing_file_is_refused_even_with_overwrite(tmp_path):
    target = tmp_path / "model.bin"
    target.write_text("the user's file")
    for overwrite in (False, True):
        with pytest.raises(InvalidInputError, match="exists and is not a folder"):
            save_model_folder(target, _weights, overwrite=overwrite)
        assert target.read_text() == "the user's file"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(InvalidInputError, match="not a folder"):
        save_model_folder(link, _weights, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "model.bin"]


def test_check_output_folder_refuses_up_front_without_side_effects(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a.txt").write_text("x")
    with pytest.raises(InvalidInputError):
        io.check_output_folder(mine, "model")
    io.check_output_folder(mine, "model", overwrite=True)
    io.check_output_folder(tmp_path / "new", "model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # nothing created


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_written_files_and_folders_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    folder = save_model_folder(tmp_path / "out", _weights)
    assert _mode(folder) == 0o777 & ~mask
    for p in folder.iterdir():
        assert _mode(p) == 0o666 & ~mask, p.name
    write_json_atomic(tmp_path / "m.json", {"a": 1})
    assert _mode(tmp_path / "m.json") == 0o666 & ~mask
    save_model_folder(folder, _weights)  # a replacement too
    assert _mode(folder) == 0o777 & ~mask and _mode(folder / "w.safetensors") == 0o666 & ~mask


def test_the_replacement_is_one_exchange_never_a_missing_folder(tmp_path, monkeypatch):
    """Between parking the old folder and renaming the new one, a kill would leave no folder at all: the swap must
    be a single step (where the system has one), so `path` always holds a complete folder."""
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    out = save_model_folder(tmp_path / "out", _weights)
    renames = []
    real = os.replace

    def spy(a, b):
        renames.append((str(a), str(b)))
        return real(a, b)

    monkeypatch.setattr(io.os, "replace", spy)
    save_model_folder(out, lambda tmp: (tmp / "x.bin").write_bytes(b"2"))
    assert [b for _, b in renames if b == str(out)] == []  # not a rename onto `out`: an exchange
    assert (out / "x.bin").read_bytes() == b"2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_temporaries_of_a_killed_writer_are_swept_not_those_of_a_live_one(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    stale = tmp_path / f".out.rw{dead_pid}@{io._HOST}.abc.tmp"
    stale.mkdir()
    (stale / "partial.bin").write_bytes(b"0")
    live = tmp_path / f".out.rw{os.getppid()}@{io._HOST}.def.tmp"
    live.mkdir()
    other = tmp_path / ".out.user-file.tmp"  # not ours: never touched
    other.write_text("keep")
    save_model_folder(tmp_path / "out", _weights)
    assert not stale.exists() and live.is_dir() and other.read_text() == "keep"


def test_writes_are_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    """A power loss after a write must not leave an empty file under the new name: data first, then the entry."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b))[1])
    write_text_atomic(tmp_path / "a.txt", "hello")
    kinds = [e[0] for e in events]
    assert kinds == ["fsync", "replace", "fsync"], events
    assert events[0][1].endswith(".tmp") and events[2][1] == str(tmp_path)
    events.clear()
    save_model_folder(tmp_path / "m", lambda d: (d / "w.txt").write_text("x"))
    synced = [e[1] for e in events if e[0] == "fsync"]
    first_replace = next(i for i, e in enumerate(events) if e[0] == "replace" and e[1] == str(tmp_path / "m"))
    assert any(p.endswith("w.txt") for p in synced[:first_replace]), events  # the folder's files before its rename
    assert events[-1] == ("fsync", str(tmp_path))
