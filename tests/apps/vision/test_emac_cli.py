"""EMAC from the command line: `rankwise run emac-autta` adapts a saved backbone over a stream file and writes the
predictions, the adapted weights and the scores; bad options are refused before the model loads."""

import json

import pytest
import torch

from rankwise.cli import main
from rankwise.core.io import load_tensors, save_tensors_atomic

pytestmark = pytest.mark.method("emac-autta")


def _stream_file(path, n=64):
    g = torch.Generator().manual_seed(0)
    save_tensors_atomic(path, {"images": torch.rand(n, 1, 14, 14, generator=g), "labels": torch.randint(-1, 10, (n,), generator=g)})
    return path


def test_run_adapts_a_model_folder_over_a_stream_file(tmp_path):
    from rankwise.core.io import save_model_folder
    from rankwise.models.vision import save_backbone, stand_in

    model_dir = tmp_path / "model"
    module = stand_in("resnet-small", 0)[0]
    save_model_folder(model_dir, lambda tmp: save_backbone(module, tmp))
    images = _stream_file(tmp_path / "stream.safetensors")
    out = tmp_path / "run"
    assert main(["--quiet", "run", "emac-autta", f"images={images}", f"model={model_dir}", "budget=0.1", "batch_size=16",
                 "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())["results"]
    assert result["annotations"] <= result["budget"] == 6 and 0 <= result["scores"]["h_score"] <= 100
    preds = load_tensors(out / "predictions.safetensors")
    assert preds["predictions"].shape == (64,) and int(preds["annotated"].sum()) == result["annotations"]
    assert (out / "adapted.safetensors").is_file()


def test_bad_options_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    import rankwise.models

    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    images = _stream_file(tmp_path / "stream.safetensors")
    for bad in (["budget=1.5"], ["budget=-0.1"], ["selector=magic"], ["loss=tent", "selector=random"]):
        assert main(["--quiet", "run", "emac-autta", f"images={images}", "model=somewhere", *bad,
                     "--out", str(tmp_path / "x")]) != 0
    assert main(["--quiet", "run", "emac-autta", f"images={tmp_path / 'missing.safetensors'}", "--out", str(tmp_path / "y")]) != 0
