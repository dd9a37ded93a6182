"""Issue 17, "done when": a real training run with checkpoints, killed at random points (SIGINT and SIGKILL), leaves
on disk either the old checkpoint or the new one, never a mix, and resuming gives the uninterrupted result bit for bit.

Each run is a separate process, forked from one helper process that imported torch and rankwise once (an import
takes seconds; a fork, milliseconds), so a handful of kills fits in a few seconds of training. The helper itself is
a subprocess: the test process is never forked.
"""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from safetensors.torch import load_file

from rankwise.core.io import MANIFEST_NAME, verify_manifest

STEPS = 40

HELPER = textwrap.dedent(
    f"""
    import json, os, sys, time, traceback
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    from rankwise.core.io import save_tensors_atomic
    from rankwise.core.progress import set_quiet
    from rankwise.models import tiny_llama
    from rankwise.training import LanguageModelingTask, TrainConfig, train

    set_quiet(True)

    def run(out):
        gen = torch.Generator().manual_seed(0)
        task = LanguageModelingTask(torch.randint(0, 1000, (32, 12), generator=gen), torch.randint(0, 1000, (4, 12), generator=gen))
        model = tiny_llama(seed=0, vocab_size=1000).requires_grad_(True)  # full fine-tuning: AdamW moments for all
        config = TrainConfig(steps={STEPS}, batch_size=4, lr=3e-3, checkpoint_every=1, warmup_ratio=0.1, seed=3)
        open(os.path.join(out, "READY"), "w").close()
        t0 = time.perf_counter()
        result = train(model, task, config, out_dir=out)
        save_tensors_atomic(os.path.join(out, "final.safetensors"), {{n: p.detach() for n, p in model.named_parameters()}})
        with open(os.path.join(out, "done.json"), "w") as f:
            json.dump({{"wall_s": time.perf_counter() - t0, "resumed_from": result.resumed_from, "losses": result.losses}}, f)

    for line in sys.stdin:
        cmd, arg = line.split()
        if cmd == "RUN":
            pid = os.fork()
            if pid == 0:  # the training process
                code = 0
                try:
                    fd = os.open(os.path.join(arg, "log.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    run(arg)
                except BaseException:  # KeyboardInterrupt from SIGINT included
                    traceback.print_exc()
                    code = 130
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            print(pid, flush=True)
        elif cmd == "WAIT":
            _, status = os.waitpid(int(arg), 0)
            print(status, flush=True)
    """
)


class Helper:
    def __init__(self, tmp_path):
        script = tmp_path / "helper.py"
        script.write_text(HELPER)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RANKWISE_QUIET": "1"}
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def _ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the helper process died"
        return int(answer)

    def start(self, out):
        out.mkdir(exist_ok=True)
        (out / "READY").unlink(missing_ok=True)
        return self._ask(f"RUN {out}")

    def wait(self, pid):
        return self._ask(f"WAIT {pid}")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _wait_ready(out, timeout=60):
    deadline = time.monotonic() + timeout
    while not (out / "READY").exists():
        assert time.monotonic() < deadline, (out / "log.txt").read_text() if (out / "log.txt").exists() else "no log"
        time.sleep(0.002)


def _check_on_disk(out, reference_history):
    """The checkpoint folder is absent or one complete checkpoint of this run: every file as its manifest says,
    nothing else in it, and its history a prefix of the uninterrupted run's (bit for bit)."""
    ckpt = out / "checkpoint"
    if not ckpt.exists():
        return 0
    manifest = verify_manifest(ckpt)
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {MANIFEST_NAME}, "files from two checkpoints mixed"
    meta = json.loads((ckpt / "trainer.json").read_text())
    step = meta["step"]
    assert 1 <= step <= STEPS and meta["history"] == reference_history[:step]
    others = {p.name for p in out.iterdir()} - {"checkpoint", "READY", "log.txt", "final.safetensors", "done.json"}
    assert all(name.startswith(".checkpoint.rw") or name.startswith(".final.safetensors.rw") for name in others), others
    return step


@pytest.mark.parametrize("seed", [0, 1])
def test_killed_runs_leave_old_or_new_and_resume_bit_for_bit(tmp_path, seed):
    helper = Helper(tmp_path)
    try:
        ref = tmp_path / "reference"
        assert helper.wait(helper.start(ref)) == 0, (ref / "log.txt").read_text()
        done = json.loads((ref / "done.json").read_text())
        reference = load_file(ref / "final.safetensors")
        history = json.loads((ref / "checkpoint" / "trainer.json").read_text())["history"]
        assert len(history) == STEPS and [h["loss"] for h in history] == done["losses"]

        rng = random.Random(seed)
        out = tmp_path / "killed"
        steps_seen = []
        for kill, sig in enumerate([signal.SIGKILL, signal.SIGINT, signal.SIGKILL, signal.SIGINT]):
            pid = helper.start(out)
            _wait_ready(out)
            time.sleep(rng.uniform(0.0, 0.7 * done["wall_s"]))
            os.kill(pid, sig)
            status = helper.wait(pid)
            killed = os.WIFSIGNALED(status) or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130)
            if not killed:  # it finished before the signal: fine, but the next kill starts from the end
                assert os.WEXITSTATUS(status) == 0
            steps_seen.append(_check_on_disk(out, history))
        assert steps_seen == sorted(steps_seen)  # progress is never lost

        pid = helper.start(out)  # the last restart runs to the end
        assert helper.wait(pid) == 0, (out / "log.txt").read_text()
        final = load_file(out / "final.safetensors")
        assert set(final) == set(reference)
        for name, value in reference.items():
            assert value.dtype == final[name].dtype and value.shape == final[name].shape
            assert (value.view(-1) == final[name].view(-1)).all(), name  # bit for bit, not close
        assert json.loads((out / "checkpoint" / "trainer.json").read_text())["history"] == history
    finally:
        helper.close()
