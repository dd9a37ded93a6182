"""DFA with feedback-weight matching: the card's invariants. DFA's updates come from the fixed feedback matrices and
the output error only (the formula, a downstream weight changed between forward and backward, F never updated),
the output layer's update is BP's, F_1 = W_2ᵀ makes DFA equal BP, the backward holds less than BP's, and the
matching maths (exact recovery, WA = 1, the projection form)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from rankwise.core.training import TrainConfig, train
from rankwise.core.training.tensor_tasks import TensorClassificationTask
from rankwise.recipes.dfa import build, cosine, feedback_matching, projection_form, weight_alignment, weight_matching

pytestmark = pytest.mark.method("dfa-feedback-matching")


class Net(nn.Module):
    """A tanh FCN in float64 (exact comparisons): body = (Linear, Tanh) x depth, then `head`."""

    def __init__(self, depth=3, width=12, inputs=10, classes=4, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        layers, d = [], inputs
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.Tanh()]
            d = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)
        self.double()

    def forward(self, x):
        return self.head(self.body(x))


def _task(n=48, inputs=10, classes=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inputs, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorClassificationTask("toy", x, y, x[:8], y[:8])


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_hidden_updates_are_feedback_times_the_output_error():
    model, task = Net(), _task()
    proc = build(model, task, 0, matching="none", weight_decay=0.0)
    batch = task.batch(torch.arange(16))
    task.loss(model, batch).backward()
    with torch.no_grad():
        h = [batch["inputs"]]
        for layer in proc.dfa_layers:
            h.append(torch.tanh(F.linear(h[-1], layer.weight, layer.bias)))
        logits = model.head(h[-1])
        e = (logits.softmax(-1) - F.one_hot(batch["labels"], 4)) / 16  # mean cross-entropy's ∂L/∂logits
        for i, layer in enumerate(proc.dfa_layers):
            delta = (e @ layer.feedback.T) * (1 - h[i + 1] ** 2)
            torch.testing.assert_close(layer.weight.grad, delta.T @ h[i], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(layer.bias.grad, delta.sum(0), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(model.head.weight.grad, e.T @ h[-1], rtol=1e-12, atol=1e-14)


def test_output_update_is_bp_and_hidden_ones_are_not():
    model, task = Net(), _task()
    proc = build(model, task, 0, matching="none", weight_decay=0.0)
    batch = task.batch(torch.arange(16))
    dfa, bp = proc.gradients(task, batch, "dfa"), proc.gradients(task, batch, "bp")
    torch.testing.assert_close(dfa["head"], bp["head"], rtol=1e-12, atol=1e-14)
    ga = proc.gradient_alignment(task, batch)
    assert ga["head"] == pytest.approx(1.0, abs=1e-12)
    assert all(-1.0 <= v <= 1.0 for v in ga.values())
    assert abs(ga["body.0"]) < 0.9  # random F: the hidden updates are not backprop's


def test_two_layers_with_feedback_matched_to_the_head_equal_bp():
    model, task = Net(depth=1), _task()
    proc = build(model, task, 0, matching="feedback", weight_decay=0.0)  # F_1 = W_2ᵀ
    torch.testing.assert_close(proc.dfa_layers[0].feedback, model.head.weight.T)
    batch = task.batch(torch.arange(16))
    dfa, bp = proc.gradients(task, batch, "dfa"), proc.gradients(task, batch, "bp")
    for name in dfa:
        torch.testing.assert_close(dfa[name], bp[name], rtol=1e-12, atol=1e-14)


def test_a_downstream_weight_changed_before_the_backward_does_not_change_an_upstream_update():
    batch = _task().batch(torch.arange(16))
    grads = {}
    for mode in ("dfa", "bp"):
        for change in (False, True):
            model, task = Net(), _task()
            proc = build(model, task, 0, matching="none", weight_decay=0.0)
            proc.hub.mode = mode
            loss = task.loss(model, batch)
            if change:
                with torch.no_grad():  # .data: the change is invisible to autograd's version counters
                    proc.dfa_layers[2].weight.data.mul_(3.0).add_(0.5)
                    model.head.weight.data.mul_(-2.0)
            loss.backward()
            grads[mode, change] = model.body[0].weight.grad.clone()
    torch.testing.assert_close(grads["dfa", True], grads["dfa", False], rtol=0, atol=0)
    assert not torch.allclose(grads["bp", True], grads["bp", False])  # backprop reads the downstream weights


def test_feedback_matrices_are_buffers_never_updated_by_training():
    model, task = Net(), _task()
    proc = build(model, task, 0, matching="fwm", weight_decay=1e-3)
    feedback0 = [layer.feedback.clone() for layer in proc.dfa_layers]
    weights0 = [layer.weight.detach().clone() for layer in proc.dfa_layers]
    params = {id(p) for p in model.parameters()}
    assert all(id(layer.feedback) not in params and not layer.feedback.requires_grad for layer in proc.dfa_layers)
    train(model, task, TrainConfig(steps=5, batch_size=8, lr=0.05), procedure=proc)
    for layer, f0, w0 in zip(proc.dfa_layers, feedback0, weights0):
        assert torch.equal(layer.feedback, f0)
        assert not torch.equal(layer.weight.detach(), w0)  # the weights did train
    assert [type(m) for m in model.body] == [nn.Linear, nn.Tanh] * 3 and type(model.head) is nn.Linear


def test_weight_decay_is_part_of_the_update():
    batch = _task().batch(torch.arange(16))
    out = {}
    for lam in (0.0, 0.1):
        model, task = Net(), _task()
        build(model, task, 0, matching="none", weight_decay=lam)
        task.loss(model, batch).backward()
        out[lam] = model
    for name, p in out[0.1].named_parameters():
        expected = dict(out[0.0].named_parameters())[name].grad + (0.1 * p.detach() if name.endswith("weight") else 0.0)
        torch.testing.assert_close(p.grad, expected, rtol=1e-12, atol=1e-14)


class Mixer(nn.Module):
    """Token states [B, T, d] through LayerNorm, Linear, GELU (functional), Linear, mean pool, head: ops between
    the linears that backprop must save for and DFA need not."""

    def __init__(self, d=16, hidden=64, classes=3):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        return self.head(h.mean(1))


def _saved_bytes(fn, exclude):
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(storages.values()), out


def test_the_dfa_backward_holds_less_than_backprop_and_its_token_updates_follow_the_formula():
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(24, 7, 16, generator=g), torch.randint(0, 3, (24,), generator=g)
    task = TensorClassificationTask("tokens", x, y, x[:4], y[:4])
    batch = task.batch(torch.arange(8))
    saved = {}
    for mode in ("bp", "dfa"):
        model = Mixer()
        proc = build(model, task, 0, matching="none", weight_decay=0.0) if mode == "dfa" else None
        saved[mode], loss = _saved_bytes(lambda: task.loss(model, batch), [*model.parameters(), *model.buffers()])
        loss.backward()
    assert saved["dfa"] < 0.75 * saved["bp"]
    assert proc.analytic_memory(batch)["activations"] <= saved["dfa"]
    with torch.no_grad():  # the error of example b reaches each of its T positions, shared 1/T (a mean pool's share)
        h1 = model.fc1(model.norm(batch["inputs"]))
        e = (model.head((batch["inputs"] + model.fc2(F.gelu(h1))).mean(1)).softmax(-1) - F.one_hot(batch["labels"], 3)) / 8
        delta = (e @ proc.dfa_layers[1].feedback.T)[:, None, :].expand(8, 7, 16) / 7
        expected = delta.reshape(-1, 16).T @ F.gelu(h1).reshape(-1, 64)
    torch.testing.assert_close(model.fc2.weight.grad, expected, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------------ the matching maths


def _aligned_chain(sizes=(9, 12, 11, 10, 4), seed=3):
    """Weights in strong alignment with random feedbacks: W_l = F_l F_{l-1}ᵀ, W_L = F_{L-1}ᵀ (float64)."""
    g = torch.Generator().manual_seed(seed)
    n_out = sizes[-1]
    fs = [torch.randn(n, n_out, generator=g, dtype=torch.float64) for n in sizes[1:-1]]
    weights = [torch.randn(sizes[1], sizes[0], generator=g, dtype=torch.float64)]
    weights += [fs[i] @ fs[i - 1].T for i in range(1, len(fs))] + [fs[-1].T.clone()]
    return weights, fs


def test_least_squares_matching_is_exact_on_strongly_aligned_weights():
    weights, _ = _aligned_chain()
    feedbacks = feedback_matching(weights)
    torch.testing.assert_close(feedbacks[-1], weights[-1].T)
    for i in range(1, len(weights) - 1):  # F̄_l F̄_{l-1}ᵀ reproduces W_l (F recovered up to its invariances)
        torch.testing.assert_close(feedbacks[i] @ feedbacks[i - 1].T, weights[i], rtol=1e-9, atol=1e-9)
    for w, w_bar in zip(weights, weight_matching(weights, feedbacks)):
        torch.testing.assert_close(w_bar, w, rtol=1e-9, atol=1e-9)
    assert all(v == pytest.approx(1.0, abs=1e-12) for v in weight_alignment(weights, feedbacks))


def test_weight_matching_sets_strong_alignment_and_equals_the_projection_form():
    g = torch.Generator().manual_seed(4)
    weights = [torch.randn(12, 9, generator=g, dtype=torch.float64), torch.randn(11, 12, generator=g, dtype=torch.float64),
               torch.randn(10, 11, generator=g, dtype=torch.float64), torch.randn(4, 10, generator=g, dtype=torch.float64)]
    feedbacks = feedback_matching(weights)
    matched = weight_matching(weights, feedbacks)
    assert torch.equal(matched[0], weights[0]) and torch.equal(matched[-1], weights[-1])
    torch.testing.assert_close(matched[-1], feedbacks[-1].T, rtol=0, atol=0)
    wa = weight_alignment(matched, feedbacks)
    assert all(abs(1 - v) <= 1e-12 for v in wa)
    assert max(abs(v) for v in weight_alignment(weights, feedbacks)[:-1]) < 0.9  # before matching: not aligned
    for i in range(1, len(weights) - 1):
        torch.testing.assert_close(matched[i], projection_form(weights[i], feedbacks[i]), rtol=1e-9, atol=1e-12)
        assert torch.linalg.matrix_rank(matched[i]) <= 4  # the cost: rank <= n_L


def test_the_procedure_matches_the_chain_and_starts_at_wa_one():
    model, task = Net(depth=4), _task()
    weights0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    proc = build(model, task, 0, matching="fwm")
    assert [proc.sites[i].name for i in proc.chain] == ["body.0", "body.2", "body.4", "body.6"]
    assert all(abs(1 - v) <= 1e-12 for v in proc.weight_alignment().values())
    now = dict(model.named_parameters())
    assert torch.equal(now["body.0.weight"].detach(), weights0["body.0.weight"])  # W_1 unconstrained
    assert torch.equal(now["head.weight"].detach(), weights0["head.weight"])
    assert not torch.equal(now["body.2.weight"].detach(), weights0["body.2.weight"])
    feedback_only = build(Net(depth=4), task, 0, matching="feedback")
    assert all(torch.equal(p.detach(), weights0[n]) for n, p in feedback_only.module.named_parameters())
    weights_only = build(Net(depth=4), task, 0, matching="weights")
    assert max(abs(v) for k, v in weights_only.weight_alignment().items() if k != "head") < 0.9  # random F kept


def test_cosines_are_of_flattened_tensors_in_the_unit_interval():
    a = torch.randn(3, 4)
    assert cosine(a, a.reshape(12)) == pytest.approx(1.0)
    assert cosine(a, -a) == pytest.approx(-1.0)
    assert cosine(a, torch.zeros(3, 4)) == 0.0
