"""The procedure hooks of the training loop: called in the documented order and number, an extra loss reaches the
gradients, a procedure's description is part of the recorded run, a non-resumable one refuses checkpoints."""

import pytest
import torch

from rankwise.adapters import adapt
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.models import tiny_llama
from rankwise.training import LanguageModelingTask, TrainConfig, train
from rankwise.training.procedures import build_procedure
from rankwise.core.training import Procedure


def _task(n=12):
    gen = torch.Generator().manual_seed(0)
    return LanguageModelingTask(torch.randint(0, 500, (n, 8), generator=gen), torch.randint(0, 500, (2, 8), generator=gen))


def _model():
    torch.manual_seed(0)
    return adapt(tiny_llama(seed=0, vocab_size=500), "lora", 2, targets=["q_proj"])


class Recorder(Procedure):
    name = "recorder"

    def __init__(self, weight: float = 0.0):
        self.calls, self.weight = [], weight

    def before_micro_batch(self, step, micro):
        self.calls.append(("micro", step, micro))

    def extra_loss(self, module):
        self.calls.append(("extra",))
        if not self.weight:
            return None
        return self.weight * sum(p.square().sum() for p in module.parameters() if p.requires_grad)

    def after_step(self, step, module, task, batch):
        assert "input_ids" in batch
        self.calls.append(("after", step))

    def end_of_training(self, module):
        self.calls.append(("end",))


def test_hooks_run_in_order_once_per_micro_batch_and_step():
    rec = Recorder()
    train(_model(), _task(), TrainConfig(steps=2, batch_size=2, grad_accum=2, lr=1e-2), procedure=rec)
    assert rec.calls == [("micro", 0, 0), ("extra",), ("micro", 0, 1), ("extra",), ("after", 0),
                         ("micro", 1, 0), ("extra",), ("micro", 1, 1), ("extra",), ("after", 1), ("end",)]


def test_a_no_op_procedure_leaves_the_trajectory_unchanged_and_an_extra_loss_changes_it():
    config = TrainConfig(steps=3, batch_size=2, lr=1e-2)
    plain = train(_model(), _task(), config).losses
    assert train(_model(), _task(), config, procedure=Recorder(0.0)).losses == plain
    assert train(_model(), _task(), config, procedure=Recorder(10.0)).losses[1:] != plain[1:]


def test_the_procedure_is_recorded_in_the_run_and_a_stopped_slice_skips_the_end_hook(tmp_path):
    config = TrainConfig(steps=4, batch_size=2, lr=1e-2, checkpoint_every=2)
    rec = Recorder()
    train(_model(), _task(), config, out_dir=tmp_path, stop_after=2, procedure=rec)
    assert ("end",) not in rec.calls
    with pytest.raises(InvalidInputError, match="procedure"):
        train(_model(), _task(), config, out_dir=tmp_path)  # the checkpoint was written by the "recorder" run


def test_a_non_resumable_procedure_refuses_checkpoints_before_any_step(tmp_path):
    class Stateful(Recorder):
        resumable = False

    rec = Stateful()
    with pytest.raises(InvalidInputError, match="checkpoint_every=0"):
        train(_model(), _task(), TrainConfig(steps=2, batch_size=2, checkpoint_every=1), out_dir=tmp_path, procedure=rec)
    assert rec.calls == []


def test_an_unknown_procedure_names_the_known_ones():
    with pytest.raises(UnknownNameError, match="known"):
        build_procedure("no-such-procedure", torch.nn.Linear(2, 2), None, 0)


def test_every_registered_builder_names_its_procedure_class():
    """Issue 32, item 13: finetune reads `runs_on` and `resumable` from the builder's return annotation before any
    model is loaded (a coa-lora run with checkpoints, a bad la-lora job); a builder without it would be checked late."""
    from rankwise.registry.tables import procedure_entries
    from rankwise.training.procedures import procedure_class

    for name in procedure_entries():
        cls = procedure_class(name)
        assert cls is not None and issubclass(cls, Procedure) and cls is not Procedure, name
    assert procedure_class("coa-lora").resumable is False and procedure_class("la-lora").runs_on == "federated"
