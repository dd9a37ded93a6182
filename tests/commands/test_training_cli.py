"""`rankwise finetune` end to end on the embedded MiniLM (a few steps), and its bad-input handling."""

import json

import pytest
import torch

from rankwise.cli import main
from peft_loading import logits_both_ways
from rounding import assert_rounding_close

ARGS = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--rank", "4", "--steps", "2", "--batch-size", "4",
        "--train-examples", "16", "--eval-examples", "8", "--seq-len", "16", "--checkpoint-every", "1"]


@pytest.mark.real_model
def test_finetune_writes_a_peft_folder_and_resumes(tmp_path, capsys):
    pytest.importorskip("peft")
    from rankwise.models import load_model

    out = tmp_path / "run"
    assert main([*ARGS, "--method", "pica", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["adapter_parameters"] == 4 * (3 * 384 + 1536 + 2 * 384)  # shared per module type
    assert len(metrics["history"]) == 2 and not (out / "head.safetensors").exists()  # the head is in the adapter

    _, tok = load_model("minilm-l6")
    theirs, ours_logits, _, ours = logits_both_ways(out / "adapter")
    assert_rounding_close(theirs, ours_logits, ours)
    # the same command again resumes from the step-2 checkpoint: nothing left to train, same result
    assert main([*ARGS, "--method", "pica", "--out", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["resumed_from"] == 2


def test_finetune_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main([*ARGS, "--method", "lora", "--rank", "999", "--out", str(tmp_path / "a")]) == 2
    assert "exceeds min(in, out)=384" in capsys.readouterr().err
    assert main([*ARGS, "--method", "lora", "--targets", "nonexistent", "--out", str(tmp_path / "b")]) == 2
    assert "no nn.Linear module matched" in capsys.readouterr().err
    assert main([*ARGS, "--method", "lora", "--task", "wiki-lm", "--out", str(tmp_path / "c")]) == 2
    assert "needs a causal language model" in capsys.readouterr().err


@pytest.mark.real_model
def test_full_fine_tuning_with_lora_pre_saves_a_model(tmp_path, capsys):
    from transformers import AutoModel

    out = tmp_path / "full"
    i = ARGS.index("--rank")
    args = ARGS[:i] + ARGS[i + 2 :]
    assert main([*args, "--method", "full", "--optimizer", "lora-pre", "--optimizer-rank", "4", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["optimizer"] == "lora-pre" and metrics["trainable_parameters"] > 22_000_000
    assert 0 < metrics["optimizer_state_bytes"] < 3 * 22_000_000 * 4  # embeddings dense, block matrices rank 4
    reloaded = AutoModel.from_pretrained(out / "model")
    assert sum(p.numel() for p in reloaded.parameters()) + 384 * 12 + 12 == metrics["trainable_parameters"]
    from rankwise.models import load_model

    again, tokenizer = load_model(out / "model")  # model and tokenizer, as the other commands' folders
    torch.testing.assert_close(again.embeddings.word_embeddings.weight, reloaded.embeddings.word_embeddings.weight)
    assert tokenizer("a river")["input_ids"]
    # resuming the same command with another optimizer is refused
    assert main([*args, "--method", "full", "--out", str(out)]) == 2
    assert "different settings" in capsys.readouterr().err


def test_finetune_optimizer_bad_input(tmp_path, capsys):
    assert main([*ARGS, "--method", "full", "--out", str(tmp_path / "a")]) == 2
    assert "takes no --rank" in capsys.readouterr().err
    assert main([*ARGS, "--method", "lora", "--optimizer", "lora-pre", "--out", str(tmp_path / "b")]) == 2
    assert "needs a rank" in capsys.readouterr().err
    assert main([*ARGS, "--method", "lora", "--optimizer", "lora-pre", "--optimizer-rank", "2", "--out", str(tmp_path / "c")]) == 2
    assert "full fine-tuning" in capsys.readouterr().err


@pytest.mark.real_model
def test_a_folder_with_a_users_files_is_refused_and_a_run_folder_resumes(tmp_path):
    """--out DIR holding someone's metrics.json: refused before any work, the file untouched."""
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "metrics.json").write_text("my own numbers")
    assert main([*ARGS, "--method", "lora", "--out", str(theirs)]) == 2
    assert (theirs / "metrics.json").read_text() == "my own numbers"
    run = tmp_path / "run"
    assert main([*ARGS, "--method", "lora", "--out", str(run)]) == 0
    assert (run / "rankwise-run.json").is_file()
    assert main([*ARGS, "--method", "lora", "--out", str(run)]) == 0  # its own run folder: accepted
