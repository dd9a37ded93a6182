"""`rankwise finetune --method lora --procedure lmao`: the updated base is written beside the adapter, both reload
(rankwise and peft) to the trained classifier, and bad procedure options are clear errors."""

import json

import pytest
import torch

from rankwise.cli import main
from peft_loading import logits_both_ways
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("lmao")

ARGS = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2", "--targets",
        "query,value", "--steps", "2", "--batch-size", "4", "--train-examples", "16", "--eval-examples", "8",
        "--seq-len", "16", "--checkpoint-every", "1", "--procedure", "lmao"]


@pytest.mark.real_model
def test_finetune_with_lmao_writes_the_updated_base_and_reloads_exactly(tmp_path):
    pytest.importorskip("peft")
    from rankwise.adapters import load_adapter
    from rankwise.models import load_model
    from rankwise.training import SequenceClassifier, topic_classification

    out = tmp_path / "run"
    assert main([*ARGS, "--procedure-option", "base_lr=1e-4", "--procedure-option", "eps=1e-3", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    original, tok = load_model("minilm-l6")
    updated, _ = load_model(out / "model")  # the base the ZO phase trained, with its tokenizer
    changed = [n for n, p in updated.named_parameters() if not torch.equal(p, original.state_dict()[n])]
    assert "embeddings.word_embeddings.weight" in changed and "encoder.layer.5.output.LayerNorm.weight" in changed
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(out / "model")
    ours = load_adapter(SequenceClassifier(load_model(out / "model")[0], 12), out / "adapter")
    task = topic_classification(tok, 16, 16, 8)
    assert ours.eval() is not None and task.evaluate(ours)["accuracy"] == metrics["final"]["accuracy"]
    # the same modules on bit-identical weights (safetensors round-trips exactly) as the run's final evaluation
    assert task.evaluate(ours)["eval_loss"] == metrics["final"]["eval_loss"]
    theirs, ours_logits, _, reloaded = logits_both_ways(out / "adapter", base=out / "model")
    assert_rounding_close(theirs, ours_logits, reloaded)
    # the same command again resumes from the step-2 checkpoint (base weights included): nothing left to train
    assert main([*ARGS, "--procedure-option", "base_lr=1e-4", "--procedure-option", "eps=1e-3", "--out", str(out)]) == 0
    again = json.loads((out / "metrics.json").read_text())
    assert again["resumed_from"] == 2 and again["final"] == metrics["final"]


def test_bad_procedure_options_are_clear_errors(tmp_path, capsys):
    assert main([*ARGS, "--procedure-option", "base_lr=-1", "--out", str(tmp_path / "a")]) == 2
    assert "base_lr" in capsys.readouterr().err
    assert main([*ARGS, "--procedure-option", "zo_lr=1e-6", "--out", str(tmp_path / "b")]) == 2
    assert "no option" in capsys.readouterr().err
