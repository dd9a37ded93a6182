"""LMAO as a training procedure on a tiny BERT classifier: the card's invariants (3 forwards + 1 backward, eta_W = 0
is LoRA bit for bit, eta_BA = 0 is a MeZO step, the ZO phase sees the updated factors and the same z, a full-rank base
update), exact resume, and the builder's checks."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters import LoraConfig, add_adapter
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_bert
from rankwise.optim.zeroth_order import SPSA, numerical_rank, step_seed
from rankwise.training import SequenceClassifier, TrainConfig, train
from rankwise.adapters.model import base_model_copy
from rankwise.optim.lmao.procedure import LmaoProcedure, lmao_procedure
from rankwise.core.training.loop import batch_indices
from rankwise.training.procedures import build_procedure

pytestmark = pytest.mark.method("lmao")


class ToyTask:
    """Random token sequences with 3 labels; `evaluate` runs no forward, so hooks count training forwards only."""

    name, metric, higher_is_better = "toy", "accuracy", True

    def __init__(self, n=12, t=6, vocab=50):
        g = torch.Generator().manual_seed(0)
        self.ids, self.labels = torch.randint(1, vocab, (n, t), generator=g), torch.randint(0, 3, (n,), generator=g)
        self.seen_A: list[tuple[bool, torch.Tensor]] = []
        self.watch: nn.Parameter | None = None

    @property
    def num_train(self):
        return self.ids.size(0)

    def batch(self, indices):
        return {"input_ids": self.ids[indices], "labels": self.labels[indices]}

    def loss(self, module, batch):
        if self.watch is not None:
            self.seen_A.append((torch.is_inference_mode_enabled(), self.watch.detach().clone()))
        ids = batch["input_ids"]
        return F.cross_entropy(module(ids, torch.ones_like(ids)), batch["labels"])

    def evaluate(self, module):
        return {"accuracy": 0.0}


def _classifier(dropout=0.0, vocab=50):
    torch.manual_seed(0)
    base = tiny_bert(seed=0, vocab_size=vocab, hidden_size=16, num_layers=2)
    adapted = add_adapter(base, LoraConfig(r=2, target_modules=["query", "value"], lora_dropout=dropout))
    torch.manual_seed(1)
    return SequenceClassifier(adapted, 3)


def _config(steps=3, **kw):
    return TrainConfig(steps=steps, batch_size=4, lr=1e-2, warmup_ratio=0.0, **kw)


def _frozen(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if not p.requires_grad}


def _trainable(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def test_three_forwards_and_one_backward_per_step():
    module, task = _classifier(), ToyTask()
    counts = {"forward": 0, "backward": 0}
    module.register_forward_hook(lambda *_: counts.__setitem__("forward", counts["forward"] + 1))
    module.register_full_backward_hook(lambda *_: counts.__setitem__("backward", counts["backward"] + 1))
    train(module, task, _config(steps=3), procedure=lmao_procedure(module, task, 0, base_lr=1e-3))
    assert counts == {"forward": 9, "backward": 3}


def test_eta_w_zero_is_lora_bit_for_bit_even_with_dropout():
    # dropout on: the ZO phase must neither draw from the global RNG nor leave the module in eval mode
    a, b, task = _classifier(0.2), _classifier(0.2), ToyTask()
    base = _frozen(a)
    torch.manual_seed(5)  # the dropout stream starts alike in both runs
    ra = train(a, task, _config(steps=4))
    procedure = lmao_procedure(b, task, 0, base_lr=0.0)
    torch.manual_seed(5)
    rb = train(b, task, _config(steps=4), procedure=procedure)
    assert ra.losses == rb.losses and procedure.last.projected_grad != 0  # the ZO forwards did run
    assert all(torch.equal(p, _trainable(a)[n]) for n, p in _trainable(b).items())
    assert all(torch.equal(p, base[n]) for n, p in _frozen(b).items())
    assert b.training == a.training


def test_a_nonzero_eta_w_changes_the_trajectory():
    a, b, task = _classifier(), _classifier(), ToyTask()
    torch.manual_seed(5)  # BERT's own dropout (0.1) is on in training
    ra = train(a, task, _config(steps=3))
    procedure = lmao_procedure(b, task, 0, base_lr=1e-2)
    torch.manual_seed(5)
    rb = train(b, task, _config(steps=3), procedure=procedure)
    assert ra.losses[0] == rb.losses[0] and ra.losses[1:] != rb.losses[1:]


def test_eta_ba_zero_is_a_mezo_step_on_the_base():
    module, task = _classifier(), ToyTask()
    plain = SequenceClassifier(copy.deepcopy(base_model_copy(module.model)), 3)  # the same base, no adapter
    plain.head.load_state_dict(module.head.state_dict())
    plain.requires_grad_(False)

    def frozen_factory(mod, config):  # eta_BA = 0 (and head lr 0): the LoRA phase moves nothing
        return torch.optim.SGD([p for p in mod.parameters() if p.requires_grad], lr=0.0)

    proc = lmao_procedure(module, task, 5, base_lr=1e-2)
    train(module, task, _config(steps=1), optimizer=frozen_factory, procedure=proc)
    batch = task.batch(batch_indices(0, 4, task.num_train, 0))  # the loop's first batch
    params = [(n, p) for n, p in plain.named_parameters() if not n.startswith("head.")]
    assert len(params) == len(proc.tensors)
    plain.eval()
    with torch.inference_mode():
        plus, minus, g = SPSA(plain, params, 1e-3).projected_gradient(lambda: task.loss(plain, batch), step_seed(5, 0))
    SPSA(plain, params, 1e-3).update(g, step_seed(5, 0), 1e-2)
    assert proc.last.projected_grad == g
    for (_, p), (_, q) in zip(proc.tensors, params):
        assert torch.equal(p, q)


def test_the_zo_phase_sees_the_updated_factors_and_updates_with_its_own_z():
    module, task = _classifier(), ToyTask()
    lora = module.model.model.encoder.layer[0].attention.self.query.adapters["default"]
    task.watch = lora.B  # B starts at 0 and moves in the first LoRA step
    w = module.model.model.encoder.layer[1].intermediate.dense.weight
    w0 = w.detach().clone()
    proc = lmao_procedure(module, task, 3, base_lr=1e-2)
    train(module, task, _config(steps=1), procedure=proc)
    modes = [m for m, _ in task.seen_A]
    assert modes == [False, True, True]  # the LoRA forward, then the two ZO forwards under inference mode
    assert not torch.equal(task.seen_A[0][1], lora.B) and torch.equal(task.seen_A[1][1], lora.B)
    assert torch.equal(task.seen_A[2][1], lora.B)
    index = [n for n, _ in proc.tensors].index("model.model.encoder.layer.1.intermediate.dense.weight")
    z = proc.spsa.noise(index, step_seed(3, 0))
    expected = w0 - 1e-2 * proc.last.projected_grad * z
    # float32, entry-wise: the update w0 + (-lr g) z and `expected` round <= 2 times each by eps / 2 of |w|, and an
    # in-place perturb / restore would add 3 more; a wrong z or step is off by lr * g * |z|, far above
    eps32 = torch.finfo(torch.float32).eps
    torch.testing.assert_close(w.detach(), expected, rtol=0, atol=8 * eps32 * float(expected.abs().max()))
    assert numerical_rank(w.detach() - w0) == min(w0.shape)


def test_resume_repeats_the_uninterrupted_run_bit_for_bit(tmp_path):
    task = ToyTask()
    whole = _classifier()
    torch.manual_seed(5)  # dropout: the checkpoint restores the RNG, so only the start needs seeding
    r_whole = train(whole, task, _config(steps=4), procedure=lmao_procedure(whole, task, 2, base_lr=1e-2))
    first = _classifier()
    torch.manual_seed(5)
    train(first, task, _config(steps=4, checkpoint_every=2), out_dir=tmp_path, stop_after=2,
          procedure=lmao_procedure(first, task, 2, base_lr=1e-2))
    second = _classifier()  # a fresh process: the original base weights, restored from the checkpoint
    r = train(second, task, _config(steps=4, checkpoint_every=2), out_dir=tmp_path,
              procedure=lmao_procedure(second, task, 2, base_lr=1e-2))
    assert r.resumed_from == 2 and r.losses == r_whole.losses
    for n, p in whole.state_dict().items():
        assert torch.equal(p, second.state_dict()[n]), n
    with pytest.raises(InvalidInputError, match="lmao base_lr"):  # another eta_W is another run
        train(_classifier(), task, _config(steps=4, checkpoint_every=2), out_dir=tmp_path,
              procedure=lmao_procedure(_classifier(), task, 2, base_lr=1e-3))


def test_the_w_selection_options():
    module, task = _classifier(), ToyTask()
    everything = lmao_procedure(module, task, 0).tensors
    names = [n for n, _ in everything]
    assert any("word_embeddings" in n for n in names) and any("LayerNorm" in n for n in names)
    assert not any("adapters" in n or n.startswith("head.") for n in names)  # the LoRA factors and head are FO
    linear = [n for n, _ in lmao_procedure(module, task, 0, params="linear").tensors]
    assert linear and all("dense" in n or "query" in n or "key" in n or "value" in n for n in linear)
    assert all(p.dim() == 2 for _, p in lmao_procedure(module, task, 0, params="matrices").tensors)
    top = [n for n, _ in lmao_procedure(module, task, 0, top_k_layers=1).tensors]
    assert top and all(".layer.1." in n for n in top)
    assert isinstance(build_procedure("lmao", module, task, 0, base_lr=1e-6), LmaoProcedure)


@pytest.mark.parametrize("options,match", [
    ({"lr": 1e-3}, "no option"), ({"base_lr": -1.0}, "base_lr"), ({"eps": 0.0}, "eps"), ({"base_lr": "fast"}, "number"),
    ({"params": "heads"}, "params"), ({"top_k_layers": 9}, "exceeds"), ({"top_k_layers": 0}, "top_k_layers"),
    ({"perturbation": "maybe"}, "perturbation"),
])
def test_bad_options_are_refused_before_training(options, match):
    module, task = _classifier(), ToyTask()
    with pytest.raises(InvalidInputError, match=match):
        lmao_procedure(module, task, 0, **options)
