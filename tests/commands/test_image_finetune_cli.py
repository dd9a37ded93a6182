"""`rankwise finetune` on an image task with a vision backbone (the path WASI, TraDy and DFA take): full fine-tuning
writes a model folder that `load_model` reloads with the trained weights, an adapter run writes a PEFT-style folder,
and a task the model cannot read is refused before the model loads. The backbone is a random stand-in saved as a
folder (the embedded ones are pretrained on first use, which takes a minute)."""

import json

import pytest
import torch

from rankwise.cli import main
from rankwise.core.io import load_tensors, save_model_folder
from rankwise.models.vision import save_backbone, tiny_vit_stand_in


@pytest.fixture
def vit_folder(tmp_path):
    model, _ = tiny_vit_stand_in(seed=0)
    save_model_folder(tmp_path / "vit", lambda tmp: save_backbone(model, tmp))
    return tmp_path / "vit"


def _args(model, out, *extra):
    return ["--quiet", "finetune", "--model", str(model), "--task", "fashion-mnist-5to9", "--steps", "3", "--batch-size", "8",
            "--train-examples", "40", "--eval-examples", "20", "--checkpoint-every", "0", *extra, "--out", str(out)]


def test_full_fine_tuning_of_a_backbone_reloads_with_its_trained_weights(vit_folder, tmp_path, tmp_cache):
    from rankwise.models import folders, load_model

    out = tmp_path / "full"
    assert main(_args(vit_folder, out, "--method", "full")) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "fashion-mnist-5to9" and 0.0 <= metrics["final"]["accuracy"] <= 1.0
    model, tokenizer = load_model(out / "model")
    assert tokenizer is None and model.image_size == 28
    saved = load_tensors(out / "model" / "model.safetensors")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    before, _ = load_model(vit_folder)
    assert not torch.equal(before.embed.weight, model.embed.weight)  # it trained
    assert (out / "head.safetensors").is_file()  # the new 5-class head
    assert folders.model_inputs(folders.identify(out / "model")) == "images"


def test_an_adapter_on_a_backbone_saves_its_factors_and_head(vit_folder, tmp_path, tmp_cache):
    out = tmp_path / "lora"
    assert main(_args(vit_folder, out, "--method", "lora", "--rank", "2", "--targets", "fc1,fc2")) == 0
    weights = load_tensors(out / "adapter" / "adapter_model.safetensors")
    assert any(k.endswith("lora_A.weight") for k in weights) and any("head" in k for k in weights)


def test_a_task_the_model_cannot_read_is_refused_before_the_model_loads(vit_folder, tmp_path, capsys, monkeypatch):
    import rankwise.models

    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(_args("minilm-l6", tmp_path / "a", "--method", "full")) == 2
    assert "reads images and --model minilm-l6 reads text" in capsys.readouterr().err
    args = _args(vit_folder, tmp_path / "b", "--method", "full")
    args[args.index("fashion-mnist-5to9")] = "wiki-topics"
    assert main(args) == 2
    assert "reads text and --model" in capsys.readouterr().err
