"""Mixed precision in the loop (`TrainConfig.autocast`): the forward runs in the chosen dtype, the weights stay
float32, a resume refuses another precision, and an unknown dtype is refused before any work."""

import dataclasses

import pytest
import torch

from rankwise.adapters import adapt
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rankwise.training import LanguageModelingTask, TrainConfig, train

CONFIG = TrainConfig(steps=4, batch_size=2, lr=1e-2, checkpoint_every=2)


def _task():
    gen = torch.Generator().manual_seed(0)
    return LanguageModelingTask(torch.randint(0, 500, (12, 8), generator=gen), torch.randint(0, 500, (2, 8), generator=gen))


def _model():
    torch.manual_seed(0)
    return adapt(tiny_llama(seed=0, vocab_size=500), "lora", 2, targets=["q_proj"])


class _Spy(LanguageModelingTask):
    """Records the dtype of the logits each training loss was computed from."""

    seen: list

    def loss(self, module, batch):
        out = module(input_ids=batch["input_ids"], labels=batch["input_ids"])
        self.seen.append(out.logits.dtype)
        return out.loss


def test_bfloat16_forward_with_float32_weights():
    task = _Spy(_task().train_windows, _task().eval_windows)
    task.seen = []
    model = _model()
    result = train(model, task, dataclasses.replace(CONFIG, autocast="bfloat16", checkpoint_every=0))
    assert task.seen == [torch.bfloat16] * CONFIG.steps
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)
    # the same run in full precision computes in float32 (the default stays off)
    task.seen = []
    train(_model(), task, dataclasses.replace(CONFIG, checkpoint_every=0))
    assert task.seen == [torch.float32] * CONFIG.steps


def test_resume_in_another_precision_is_refused(tmp_path):
    train(_model(), _task(), dataclasses.replace(CONFIG, autocast="bfloat16"), out_dir=tmp_path, stop_after=2)
    with pytest.raises(InvalidInputError, match="autocast"):
        train(_model(), _task(), CONFIG, out_dir=tmp_path)
    resumed = train(_model(), _task(), dataclasses.replace(CONFIG, autocast="bfloat16"), out_dir=tmp_path)
    assert resumed.resumed_from == 2


def test_a_full_precision_checkpoint_records_no_autocast_field(tmp_path):
    """Checkpoints written before the field existed resume: the default is not recorded."""
    import json

    train(_model(), _task(), CONFIG, out_dir=tmp_path, stop_after=2)
    assert "autocast" not in json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())["run"]


@pytest.mark.parametrize("bad", ["bf16", "float64", 16])
def test_unknown_autocast_dtype_is_refused_before_training(bad):
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(InvalidInputError, match="autocast must be"):
        train(model, _task(), dataclasses.replace(CONFIG, autocast=bad))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
