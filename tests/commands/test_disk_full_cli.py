"""A disk that fills up mid-run (issue 32, item 14): one line that says the earlier state is intact, and it is."""

import errno
import json

from rankwise.cli import main
from rankwise.core.io import verify_manifest
from rankwise.models import load_smollm2_tokenizer, tiny_llama


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, capsys, monkeypatch):
    import rankwise.core.training.checkpoint as checkpoint

    base = tmp_path / "base"
    tiny_llama(seed=0, num_layers=1).save_pretrained(base)
    load_smollm2_tokenizer().save_pretrained(base)
    real, calls = checkpoint.save_tensors_atomic, []

    def fills_up(path, *args, **kwargs):  # the second checkpoint's tensors hit a full disk half-way
        calls.append(path)
        if len(calls) == 2:
            path.write_bytes(b"\0" * 100)  # a partial temporary, as a real ENOSPC leaves
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_tensors_atomic", fills_up)
    out = tmp_path / "run"
    argv = ["--quiet", "finetune", "--model", str(base), "--task", "wiki-lm", "--method", "lora", "--rank", "2",
            "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--train-examples", "8", "--eval-examples", "2",
            "--eval-every", "0", "--checkpoint-every", "1", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "intact" in err
    assert json.loads((out / "checkpoint" / "trainer.json").read_text())["step"] == 1
    verify_manifest(out / "checkpoint")  # the step-1 checkpoint, whole
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "rankwise-run.json"]  # no temporary left behind
    monkeypatch.setattr(checkpoint, "save_tensors_atomic", real)
    assert main(argv) == 0  # space freed: the same command resumes
