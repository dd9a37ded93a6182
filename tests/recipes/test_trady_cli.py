"""TraDy from the command line: `finetune --method full --procedure trady` on MiniLM trains only the drawn slices
and the head and writes a model folder that loads like any other; what the procedure cannot do (resume) and bad
options are refused before the model loads."""

import json

import pytest
import torch

from rankwise.cli import main

pytestmark = pytest.mark.method("trady")

ARGS = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--steps", "2", "--batch-size", "4",
        "--train-examples", "16", "--eval-examples", "8", "--seq-len", "16", "--method", "full", "--procedure", "trady"]


@pytest.mark.real_model
def test_trady_fine_tunes_minilm_and_saves_a_normal_model(tmp_path):
    from rankwise.models import load_model

    out = tmp_path / "run"
    assert main([*ARGS, "--procedure-option", "budget=0.05", "--checkpoint-every", "0", "--lr", "0.1", "--out", str(out)]) == 0
    assert (out / "model" / "config.json").is_file() and (out / "head.safetensors").is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 2 and "accuracy" in metrics["final"]
    trained, _ = load_model(str(out / "model"))
    base, _ = load_model("minilm-l6")
    changed = {n for n, p in trained.state_dict().items() if not torch.equal(p, base.state_dict()[n])}
    assert changed and all(n.endswith(".weight") and "LayerNorm" not in n and "embeddings" not in n for n in changed)
    # Only input-channel slices moved: in a changed linear most columns are bit-identical.
    name = sorted(changed)[0]
    same_columns = (trained.state_dict()[name] == base.state_dict()[name]).all(dim=0)
    assert same_columns.float().mean() > 0.5


def test_what_trady_cannot_do_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import rankwise.models

    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main([*ARGS, "--out", str(tmp_path / "a")]) == 2  # finetune's default --checkpoint-every 50
    assert "cannot be resumed: pass --checkpoint-every 0" in capsys.readouterr().err
    assert main([*ARGS, "--checkpoint-every", "0", "--procedure-option", "budget=2", "--out", str(tmp_path / "b")]) == 2
    assert "budget is a share of the full training cost in (0, 1]" in capsys.readouterr().err
    assert main([*ARGS, "--checkpoint-every", "0", "--procedure-option", "selection=best", "--out", str(tmp_path / "c")]) == 2
    assert "selection must be one of" in capsys.readouterr().err
