"""Issue 17, item 3: a checkpoint records the full run configuration; a resume with any other setting is refused,
naming the field (the harness's own settings, the task's size, and what the caller built the model and data from)."""

import json

import pytest
import torch

from rankwise.adapters import adapt
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rankwise.training import LanguageModelingTask, TrainConfig, train

CONFIG = TrainConfig(steps=4, batch_size=2, lr=1e-2, checkpoint_every=2)


def _task(n=12):
    gen = torch.Generator().manual_seed(0)
    return LanguageModelingTask(torch.randint(0, 500, (n, 8), generator=gen), torch.randint(0, 500, (2, 8), generator=gen))


def _model(alpha=16.0):
    torch.manual_seed(0)
    return adapt(tiny_llama(seed=0, vocab_size=500), "lora", 2, targets=["q_proj"], lora_alpha=alpha)


def _run_config(alpha=16.0, train_examples=12):
    return {"model": "tiny", "method": "lora", "rank": 2, "option lora_alpha": alpha, "train_examples": train_examples, "seq_len": 8}


def test_resume_with_another_option_is_refused_naming_it(tmp_path):
    train(_model(), _task(), CONFIG, out_dir=tmp_path, stop_after=2, run_config=_run_config())
    saved = json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())["run"]
    assert saved["option lora_alpha"] == 16.0 and saved["num_train"] == 12 and saved["model"] == "tiny"
    # same parameter names and shapes, another scale: before, this resumed and exited 0 with a different model
    with pytest.raises(InvalidInputError, match=r"option lora_alpha \(checkpoint 16\.0, now 64\.0\)"):
        train(_model(64.0), _task(), CONFIG, out_dir=tmp_path, run_config=_run_config(64.0))
    resumed = train(_model(), _task(), CONFIG, out_dir=tmp_path, run_config=_run_config())  # the same settings resume
    assert resumed.resumed_from == 2


def test_resume_with_other_data_is_refused_even_without_a_run_config(tmp_path):
    train(_model(), _task(12), CONFIG, out_dir=tmp_path, stop_after=2)
    with pytest.raises(InvalidInputError, match=r"num_train \(checkpoint 12, now 10\)"):
        train(_model(), _task(10), CONFIG, out_dir=tmp_path)


def test_a_field_missing_on_either_side_is_a_mismatch(tmp_path):
    train(_model(), _task(), CONFIG, out_dir=tmp_path, stop_after=2, run_config=_run_config())
    with pytest.raises(InvalidInputError, match=r"train_examples \(checkpoint 12, not set by this run\)"):
        train(_model(), _task(), CONFIG, out_dir=tmp_path, run_config={k: v for k, v in _run_config().items() if k != "train_examples"})
    with pytest.raises(InvalidInputError, match=r"extra \(not recorded in the checkpoint"):
        train(_model(), _task(), CONFIG, out_dir=tmp_path, run_config={**_run_config(), "extra": 1})
    with pytest.raises(InvalidInputError, match="may not redefine"):
        train(_model(), _task(), CONFIG, out_dir=tmp_path, run_config={"lr": 1.0})


def test_finetune_passes_its_whole_configuration(tmp_path, monkeypatch):
    """The command records model, method, rank, every --option, data selection and sequence length."""
    seen = {}

    def fake_train(module, task, config, **kw):
        seen.update(kw["run_config"])
        raise SystemExit(0)

    monkeypatch.setattr("rankwise.training.procedures.train", fake_train)  # the command trains through run_procedure
    from rankwise.cli import main

    args = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2",
            "--option", "lora_alpha=64", "--train-examples", "8", "--eval-examples", "4", "--seq-len", "8",
            "--steps", "1", "--batch-size", "2", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit):
        main(args)
    assert {"model": "minilm-l6", "method": "lora", "rank": 2, "option lora_alpha": 64, "train_examples": 8,
            "eval_examples": 4, "seq_len": 8}.items() <= seen.items()


# -- issue 32, item 14: a crafted checkpoint (its manifest rewritten to match) is refused in words -------------------
def _crafted(tmp_path, edit_meta=None, edit_tensors=None):
    """A real checkpoint at step 2 of 4, its trainer.json or state.safetensors edited and its manifest rewritten, so
    that only the values themselves can tell."""
    from rankwise.core.io import load_tensors, read_json, save_tensors_atomic, write_manifest

    train(_model(), _task(), CONFIG, out_dir=tmp_path, stop_after=2)
    folder = tmp_path / "checkpoint"
    if edit_meta is not None:
        (folder / "trainer.json").write_text(json.dumps(edit_meta(read_json(folder / "trainer.json"))))
    if edit_tensors is not None:
        tensors = edit_tensors(dict(load_tensors(folder / "state.safetensors")))
        save_tensors_atomic(folder / "state.safetensors", tensors)
    write_manifest(folder, {k: v for k, v in read_json(folder / "rankwise-manifest.json").items() if k != "files"})


@pytest.mark.parametrize("edit, says", [
    (lambda m: {**m, "step": "two"}, "field 'step' must be an integer"),
    (lambda m: {**m, "step": 1.5}, "field 'step' must be an integer"),  # int(1.5) resumed silently at step 1
    (lambda m: {**m, "step": -3}, "outside the run's 0..4 steps"),
    (lambda m: {**m, "step": 1000}, "outside the run's 0..4 steps"),  # "resumed" past the end: nothing trained
    (lambda m: {**m, "history": [1, 2]}, "'history' must be a list of JSON objects"),
    (lambda m: {**m, "run": [1]}, "field 'run' must be a JSON object"),
])
def test_a_crafted_trainer_json_is_refused_naming_the_field(tmp_path, edit, says):
    from rankwise.errors import CorruptFileError

    _crafted(tmp_path, edit_meta=edit)
    with pytest.raises(CorruptFileError, match=says):
        train(_model(), _task(), CONFIG, out_dir=tmp_path)


@pytest.mark.parametrize("edit, says", [
    (lambda t: {**t, "rng/torch": t["rng/torch"].float()}, "no valid RNG state"),
    (lambda t: {**t, "rng/torch": t["rng/torch"][:10]}, "no valid RNG state"),
    (lambda t: {k: v for k, v in t.items() if k != "rng/torch"}, r"rng/torch: missing"),
    (lambda t: {k: v[:1] if k.endswith("/exp_avg") else v for k, v in t.items()}, "optimizer state exp_avg"),
])
def test_a_crafted_rng_or_optimizer_state_is_refused_before_the_model_is_touched(tmp_path, edit, says):
    from rankwise.errors import CorruptFileError

    _crafted(tmp_path, edit_tensors=edit)
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(CorruptFileError, match=says):
        train(model, _task(), CONFIG, out_dir=tmp_path)
    if "RNG" in says or "rng" in says:  # refused before any parameter was overwritten
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
