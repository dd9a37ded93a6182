"""One writer per --out folder (issue 32, item 9): a second command refuses, naming the first; a stale lock does not."""

import json
import subprocess
import sys

import pytest

from rankwise.cli import main
from rankwise.core.output_lock import lock_path, output_lock
from rankwise.errors import InvalidInputError


@pytest.fixture
def live_process():
    """Another live process (a sleeping child), to stand for a command still running."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def _write_lock(out, pid, host=None):
    import socket

    lock_path(out).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "started": "then",
                                          "command": "rankwise finetune --out x"}))


def test_a_second_writer_is_refused_naming_the_first(tmp_path, live_process, capsys):
    out = tmp_path / "run"
    _write_lock(out, live_process)
    # the lock is checked before the command starts (here, before its own argument checks would refuse the model)
    assert main(["--quiet", "finetune", "--model", "no-such-model", "--task", "wiki-lm", "--method", "lora", "--rank", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"pid {live_process}" in err and "rankwise finetune --out x" in err
    assert not out.exists() and lock_path(out).exists()  # nothing written, the holder's lock kept


def test_a_stale_lock_is_taken_over_and_released(tmp_path):
    out = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(out, dead.pid)
    with output_lock(out):
        assert json.loads(lock_path(out).read_text())["pid"] != dead.pid
    assert not lock_path(out).exists()


def test_the_lock_is_released_when_the_command_fails(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError), output_lock(out):
        raise ValueError("the work failed")
    assert not lock_path(out).exists()


def test_a_lock_held_on_another_machine_is_respected(tmp_path):
    out = tmp_path / "run"
    _write_lock(out, 1, host="another-host.invalid")
    with pytest.raises(InvalidInputError, match="another-host.invalid"), output_lock(out):
        pass


def test_a_half_written_lock_counts_as_stale(tmp_path):
    out = tmp_path / "run"
    lock_path(out).write_text('{"pid": 12')
    with output_lock(out):
        pass
    assert not lock_path(out).exists()


def test_a_long_out_name_still_gets_a_lock(tmp_path):
    out = tmp_path / ("r" * 250)  # a legal name whose ".NAME.rankwise-lock" would exceed 255 bytes
    with output_lock(out):
        assert lock_path(out).exists() and len(lock_path(out).name) < 255
    assert not lock_path(out).exists()
