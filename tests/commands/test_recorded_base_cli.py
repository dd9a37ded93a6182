"""The base a run trains on is recorded by absolute path and content (issue 32, items 7, 8, 16, 17).

An adapter means nothing on other weights: evaluating it from another working directory must load the same base,
and a base folder replaced at the same path must be refused (by `eval ppl` and by resume), not silently used. An
option given at its default value is the same run as one left out, so resume accepts it.
"""

import json
import shutil

import pytest

from rankwise.cli import main
from rankwise.models import load_smollm2_tokenizer, tiny_llama

TRAIN = ["--quiet", "finetune", "--task", "wiki-lm", "--method", "lora", "--rank", "2", "--steps", "2", "--batch-size", "2",
         "--seq-len", "16", "--train-examples", "8", "--eval-examples", "2", "--eval-every", "0", "--checkpoint-every", "1"]


def _model_folder(path, seed: int) -> None:
    tiny_llama(seed=seed, num_layers=1).save_pretrained(path)
    load_smollm2_tokenizer().save_pretrained(path)


@pytest.fixture
def trained(tmp_path, monkeypatch):
    """A LoRA run on `base/` given as a relative path from tmp_path; returns (tmp_path, run folder)."""
    _model_folder(tmp_path / "base", seed=0)
    monkeypatch.chdir(tmp_path)
    assert main([*TRAIN, "--model", "base", "--out", "run"]) == 0
    return tmp_path, tmp_path / "run"


def test_the_adapter_records_the_absolute_base_and_its_digest(trained):
    root, run = trained
    peft = json.loads((run / "adapter" / "adapter_config.json").read_text())
    ours = json.loads((run / "adapter" / "rankwise_adapter.json").read_text())
    assert peft["base_model_name_or_path"] == str((root / "base").resolve())
    assert len(ours["base_sha256"]) == 64


def test_eval_from_another_cwd_uses_the_recorded_base_and_refuses_a_replaced_one(trained, capsys, monkeypatch):
    root, run = trained
    elsewhere = root / "elsewhere"
    (elsewhere / "base").mkdir(parents=True)  # a different folder at the same relative path
    _model_folder(elsewhere / "base", seed=1)
    monkeypatch.chdir(elsewhere)
    ppl = ["--quiet", "eval", "ppl", "--model", str(run / "adapter"), "--seq-len", "16", "--max-windows", "1"]
    assert main(ppl) == 0
    assert str((root / "base").resolve()) in capsys.readouterr().out

    shutil.rmtree(root / "base")
    _model_folder(root / "base", seed=1)  # replaced in place: same path, other weights
    assert main(ppl) == 2
    err = capsys.readouterr().err
    assert "content differs" in err and "--base" in err


def test_a_moved_base_is_named_as_missing(trained, capsys):
    root, run = trained
    (root / "base").rename(root / "moved")
    assert main(["--quiet", "eval", "ppl", "--model", str(run / "adapter"), "--seq-len", "16", "--max-windows", "1"]) == 2
    err = capsys.readouterr().err
    assert "recorded base model" in err and "does not exist" in err
    assert main(["--quiet", "eval", "ppl", "--model", str(run / "adapter"), "--base", str(root / "moved"),
                 "--seq-len", "16", "--max-windows", "1"]) == 0  # the same content, named explicitly


def test_resume_refuses_a_base_replaced_at_the_same_path(trained, capsys):
    root, _ = trained
    shutil.rmtree(root / "base")
    _model_folder(root / "base", seed=1)
    assert main([*TRAIN, "--model", "base", "--out", "run"]) == 2
    err = capsys.readouterr().err
    assert "model_sha256" in err and "different settings" in err


def test_resume_accepts_an_option_given_at_its_default(trained, capsys):
    _, run = trained
    assert main([*TRAIN, "--model", "base", "--out", "run", "--option", "lora_alpha=8"]) == 0  # LoraConfig's default
    assert main([*TRAIN, "--model", "base", "--out", "run", "--option", "lora_alpha=16"]) == 2
    assert "option lora_alpha (checkpoint 8.0, now 16" in capsys.readouterr().err


def test_a_run_inside_its_own_base_folder_is_refused(tmp_path, capsys):
    _model_folder(tmp_path / "base", seed=0)
    assert main([*TRAIN, "--model", str(tmp_path / "base"), "--out", str(tmp_path / "base" / "run")]) == 2
    assert "lies inside --model" in capsys.readouterr().err
    assert not (tmp_path / "base" / "run").exists()
