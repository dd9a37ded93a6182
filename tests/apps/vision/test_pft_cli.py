"""PFT from the command line: `rankwise run pft-fer` adapts the reproduction's source model to one person's neutral
frames and scores it on theirs; expressive frames in the adaptation file and malformed files are refused before any
training."""

import json

import pytest
import torch

from rankwise.cli import main
from rankwise.core.io import load_tensors, save_tensors_atomic
from rankwise.data.faces import render_faces, sample_subjects

pytestmark = pytest.mark.method("pft-fer")


def _person_files(tmp_path):
    person = sample_subjects(1, seed=123)
    neutral = render_faces(person, 6, 7, labels=(0,))
    test = render_faces(person, 4, 8)
    save_tensors_atomic(tmp_path / "neutral.safetensors", {"images": neutral.images, "labels": neutral.labels})
    save_tensors_atomic(tmp_path / "test.safetensors", {"images": test.images, "labels": test.labels})
    return tmp_path / "neutral.safetensors", tmp_path / "test.safetensors"


def test_run_personalises_and_scores(tmp_path):
    neutral, test = _person_files(tmp_path)
    out = tmp_path / "run"
    assert main(["--quiet", "run", "pft-fer", f"neutral={neutral}", f"test={test}", "steps=3", "source_steps=5",
                 "pretrain_steps=2", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())["results"]
    assert result["neutral_frames"] == 6 and 0 <= result["adapted"]["macro_f1"] <= 100
    assert load_tensors(out / "predictions.safetensors")["predictions"].shape == (8,)
    assert (out / "translator.safetensors").is_file()


def test_bad_files_are_refused_before_training(tmp_path, monkeypatch):
    import rankwise.repro.pft_fer.data as data

    monkeypatch.setattr(data, "train_source_model", lambda *a, **k: pytest.fail("training started"))
    neutral, test = _person_files(tmp_path)
    expressive = tmp_path / "expressive.safetensors"
    save_tensors_atomic(expressive, {"images": torch.rand(4, 1, 48, 48), "labels": torch.tensor([0, 1, 0, 0])})
    wrong = tmp_path / "wrong.safetensors"
    save_tensors_atomic(wrong, {"images": torch.rand(4, 1, 32, 32)})
    unscaled = tmp_path / "unscaled.safetensors"
    save_tensors_atomic(unscaled, {"images": torch.rand(4, 1, 48, 48) * 255})
    for bad in ([f"neutral={expressive}"], [f"neutral={wrong}"], [f"neutral={unscaled}"],
                [f"neutral={neutral}", f"test={tmp_path / 'missing.safetensors'}"], [f"neutral={neutral}", "steps=0"]):
        assert main(["--quiet", "run", "pft-fer", *bad, "--out", str(tmp_path / "x")]) != 0
