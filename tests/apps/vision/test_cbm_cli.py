"""The concept bottleneck from the command line: `rankwise run ivq-concept-bottleneck:fit` trains on a labelled image
file with a JSON of concept groups and writes the model and its validation metrics; malformed inputs are refused
before any model loads."""

import json

import pytest
import torch

from rankwise.cli import main
from rankwise.core.io import load_tensors, save_tensors_atomic

pytestmark = pytest.mark.method("ivq-concept-bottleneck")
GROUPS = {"shape": ["circle", "square"], "colour": ["red", "green", "blue"]}


def _files(tmp_path, n=24, k=2, shape=(3, 32, 32)):
    g = torch.Generator().manual_seed(0)
    concepts = torch.stack([torch.randint(0, 2, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)], 1)[:, :k]
    save_tensors_atomic(tmp_path / "data.safetensors", {"images": torch.rand(n, *shape, generator=g),
                                                        "classes": concepts[:, 0].clone(), "concepts": concepts.contiguous()})
    (tmp_path / "groups.json").write_text(json.dumps(GROUPS))
    return tmp_path / "data.safetensors", tmp_path / "groups.json"


@pytest.mark.real_model
def test_run_fits_a_cbm_from_files(tmp_path):
    data, groups = _files(tmp_path)
    out = tmp_path / "run"
    assert main(["--quiet", "run", "ivq-concept-bottleneck", f"data={data}", f"groups={groups}", "epochs=1",
                 "pretrained=false", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())["results"]
    assert result["train_images"] + result["val_images"] == 24 and result["groups"] == GROUPS
    assert 0 <= result["val"]["concept_acc"] <= 100 and len(result["rank_curve"]) == 2
    assert any(k.startswith("quantizer") or "codebook" in k for k in load_tensors(out / "cbm.safetensors"))


def test_bad_inputs_are_refused_before_any_model_loads(tmp_path, monkeypatch):
    import rankwise.models

    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    data, groups = _files(tmp_path)
    bad_groups = tmp_path / "bad.json"
    bad_groups.write_text(json.dumps({"shape": []}))
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    wrong_data, _ = _files(wrong, shape=(1, 28, 28))
    for args in ([f"data={data}", f"groups={bad_groups}"], [f"data={wrong_data}", f"groups={groups}"],
                 [f"data={data}", f"groups={groups}", "val_fraction=1.5"], [f"data={data}", f"groups={groups}", "regulariser=magic"],
                 [f"data={tmp_path / 'none.safetensors'}", f"groups={groups}"]):
        assert main(["--quiet", "run", "ivq-concept-bottleneck", *args, "--out", str(tmp_path / "x")]) != 0
