"""Issue 17, item 5: the calibration cache checks SHA-256 on load, is capped with LRU eviction, keeps no partial
entries, and `rankwise cache list|clear` shows and empties it."""

import os
import subprocess
import sys

import pytest
import torch

from rankwise.core.calibration import collect_second_moments
from rankwise.errors import InvalidInputError, NumericalError
from rankwise.models import tiny_llama

NAMES = ["model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"]


def _batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1000, (2, 16), generator=g) for _ in range(3)]


def _data_files(cache):
    return [p for p in (cache / "calibration").rglob("*.safetensors")]


def test_an_entry_overwritten_in_place_is_detected_and_recomputed(tmp_cache):
    model = tiny_llama(seed=4)
    first = collect_second_moments(model, NAMES, _batches())
    [data] = _data_files(tmp_cache)
    blob = bytearray(data.read_bytes())
    size = len(blob)
    n = min(64 * 1024, size // 2)  # same size, tensor bytes overwritten: only the hash can tell
    blob[size - n :] = bytes(range(256)) * (n // 256) + bytes(n % 256)
    data.write_bytes(bytes(blob))
    assert data.stat().st_size == size
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        again = collect_second_moments(model, NAMES, _batches())
    for name in NAMES:
        assert torch.equal(again[name].sum_xxT, first[name].sum_xxT)  # recomputed, not the damaged bytes
    [data] = _data_files(tmp_cache)  # and stored again, intact
    hit = collect_second_moments(model, NAMES, _batches())
    assert torch.equal(hit[NAMES[1]].sum_xxT, first[NAMES[1]].sum_xxT)


def test_the_cache_is_capped_and_evicts_the_least_recently_used(tmp_cache, monkeypatch):
    from rankwise.core.cache import cache_entries

    model = tiny_llama(seed=4)
    collect_second_moments(model, NAMES, _batches(0))
    [one] = cache_entries()
    monkeypatch.setenv("RANKWISE_CACHE_MAX_BYTES", str(int(2.5 * one.bytes)))  # room for two entries
    collect_second_moments(model, NAMES, _batches(1))
    os.utime(one.path, (1, 1))  # entry 0 was used long ago...
    collect_second_moments(model, NAMES, _batches(0))  # ...and is used again now: entry 1 is the oldest
    collect_second_moments(model, NAMES, _batches(2))  # a third entry does not fit: the LRU one goes
    entries = cache_entries()
    assert len(entries) == 2 and sum(e.bytes for e in entries) <= 2.5 * one.bytes
    assert one.path in {e.path for e in entries}  # the recently used entry survived
    monkeypatch.setenv("RANKWISE_CACHE_MAX_BYTES", "1")  # smaller than any entry: the newest one stays, alone
    collect_second_moments(model, NAMES, _batches(3))
    assert len(cache_entries()) == 1


def test_cache_size_setting_is_validated(monkeypatch):
    from rankwise.core.cache import DEFAULT_MAX_BYTES, max_cache_bytes

    monkeypatch.delenv("RANKWISE_CACHE_MAX_BYTES", raising=False)
    assert max_cache_bytes() == DEFAULT_MAX_BYTES
    monkeypatch.setenv("RANKWISE_CACHE_MAX_BYTES", "2G")
    assert max_cache_bytes() == 2 * 2**30
    monkeypatch.setenv("RANKWISE_CACHE_MAX_BYTES", "lots")
    with pytest.raises(InvalidInputError, match="RANKWISE_CACHE_MAX_BYTES"):
        max_cache_bytes()


def test_a_failed_or_killed_run_leaves_no_partial_entry(tmp_cache):
    model = tiny_llama(seed=4)
    bad = _batches()
    with torch.no_grad():
        model.model.layers[0].input_layernorm.weight.fill_(float("nan"))
    with pytest.raises(NumericalError):
        collect_second_moments(model, NAMES, bad)
    assert not (tmp_cache / "calibration").exists() or list((tmp_cache / "calibration").iterdir()) == []
    # a run killed while writing leaves its temporary folder; the next write sweeps it (its writer is gone)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout)
    from rankwise.core import io

    stale = tmp_cache / "calibration" / f".0123abcd.rw{dead}@{io._HOST}.x.tmp"
    stale.mkdir(parents=True)
    (stale / "moments.safetensors").write_bytes(b"\0" * 1000)
    collect_second_moments(tiny_llama(seed=4), NAMES, _batches())
    assert not stale.exists()
    assert len([p for p in (tmp_cache / "calibration").iterdir()]) == 1


def test_cache_list_and_clear_commands(tmp_cache, capsys):
    from rankwise.cli import main

    assert main(["cache", "list"]) == 0
    assert "empty" in capsys.readouterr().out
    collect_second_moments(tiny_llama(seed=4), NAMES, _batches())
    (tmp_cache / "models").mkdir()
    (tmp_cache / "models" / "old.bin").write_bytes(b"1" * 10)
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    # a file without a rankwise manifest (an old version's, or anyone's) is not an entry: not listed, never removed
    assert "calibration/" in out and "models/old.bin" not in out and str(tmp_cache) in out
    assert main(["cache", "clear", "--namespace", "calibration"]) == 0
    assert "removed 1 entr" in capsys.readouterr().out
    assert list((tmp_cache / "calibration").iterdir()) == [] and (tmp_cache / "models" / "old.bin").is_file()
    assert main(["cache", "clear"]) == 0
    assert (tmp_cache / "models" / "old.bin").is_file()  # issue 32: clear removes only what rankwise wrote


def test_an_unreadable_entry_is_rebuilt_not_a_crash(tmp_cache, monkeypatch):
    """Issue 32, item 14: a file of an entry that cannot be read (permissions) raised PermissionError out of the
    lookup; like a corrupted entry, it is discarded and the caller recomputes it."""
    from unreadable import make_unreadable

    model = tiny_llama(seed=4)
    first = collect_second_moments(model, NAMES, _batches())
    [data] = _data_files(tmp_cache)
    make_unreadable(data, monkeypatch)
    with pytest.warns(UserWarning, match="corrupted cache entry.*cannot be read"):
        again = collect_second_moments(model, NAMES, _batches())
    for name in NAMES:
        assert torch.equal(again[name].sum_xxT, first[name].sum_xxT)
    assert len(_data_files(tmp_cache)) == 1  # stored again, in place of the unreadable one
