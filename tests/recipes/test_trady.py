"""TraDy: the card's invariants on the sparse layers and the draws — the weight gradient from the kept slice equals
the full gradient's columns, the saved activations are exactly the selected channels' (saved_tensors_hooks and the
graph's saved tensors against the analytic count), the budget fill, reproducible and uniform draws, frozen channels
bit-identical, budget = everything equals full fine-tuning — and bad input refused before training."""

import copy

import pytest
import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from rankwise.core.training import Procedure, TrainConfig, train
from rankwise.core.training.tensor_tasks import TensorClassificationTask
from rankwise.errors import InvalidInputError
from rankwise.recipes.trady import (ChannelSparse, LayerGeometry, TradyConfig, UnitPool, build, fill_budget,
                                    random_selection, rank_layers, load_ranking, sgd)
from rankwise.recipes.trady.costs import OUTPUT
from rankwise.recipes.trady.velocity import VelocityTracker

pytestmark = pytest.mark.method("trady")


class Net(nn.Module):
    """A small CNN with batch norm and a linear head, like the SmallResNet stand-in but faster."""

    def __init__(self, classes=3):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.Conv2d(4, 6, 3, 2, 1), nn.ReLU(), nn.Conv2d(6, 6, 1, bias=False), nn.ReLU())
        self.fc = nn.Linear(6, 5)
        self.head = nn.Linear(5, classes)

    def forward(self, x):
        return self.head(torch.relu(self.fc(self.body(x).mean(dim=(2, 3)))))


def _task(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.rand(n + 16, 1, 8, 8, generator=g), torch.randint(0, 3, (n + 16,), generator=g)
    return TensorClassificationTask("toy", x[:n], y[:n], x[n:], y[n:])


def _sparse(layer, index):
    bank = nn.Parameter(torch.zeros(layer.weight.numel(), dtype=layer.weight.dtype))
    sparse = ChannelSparse(layer, trainable=True)
    sparse.attach(bank)
    sparse.place(torch.as_tensor(index), 0)
    sparse.mark_synced()
    return sparse, bank


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_the_weight_gradient_from_the_kept_slice_equals_the_full_gradients_columns(kind):
    torch.manual_seed(1)
    if kind == "conv":
        layer = nn.Conv2d(5, 7, 3, stride=2, padding=1, dilation=1).double()
        x = torch.randn(3, 5, 9, 9, dtype=torch.float64, requires_grad=True)
    else:
        layer = nn.Linear(5, 7).double()
        x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    sel = torch.tensor([0, 2, 3])
    dense = copy.deepcopy(layer)
    y = dense(x)
    g = torch.randn_like(y)
    y.backward(g)
    full_w, full_x = dense.weight.grad, x.grad.clone()
    x.grad = None
    sparse, bank = _sparse(copy.deepcopy(layer), sel)
    y2 = sparse(x)
    torch.testing.assert_close(y2, y, rtol=0, atol=1e-12)
    y2.backward(g)
    torch.testing.assert_close(bank.grad[: sparse.slice_numel()].view(sparse.slice_shape()), full_w[:, sel], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(x.grad, full_x, rtol=1e-10, atol=1e-12)
    assert (bank.grad[sparse.slice_numel():] == 0).all()


def test_output_neuron_selection_gives_the_full_gradients_rows():
    torch.manual_seed(2)
    layer = nn.Conv2d(4, 6, 3, padding=1).double()
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    dense = copy.deepcopy(layer)
    dense(x).square().sum().backward()
    bank = nn.Parameter(torch.zeros(layer.weight.numel(), dtype=torch.float64))
    sparse = ChannelSparse(copy.deepcopy(layer), trainable=True, axis=OUTPUT)
    sparse.attach(bank)
    sparse.place(torch.tensor([1, 4]), 0)
    sparse.mark_synced()
    sparse(x).square().sum().backward()
    torch.testing.assert_close(bank.grad[: sparse.slice_numel()].view(2, 4, 3, 3), dense.weight.grad[[1, 4]], rtol=1e-10, atol=1e-12)


def test_the_saved_activations_are_exactly_the_selected_channels():
    torch.manual_seed(3)
    layer = nn.Conv2d(6, 4, 3, padding=1, bias=True)
    x = torch.randn(2, 6, 5, 5, requires_grad=True)
    sel = torch.tensor([1, 4])
    sparse, bank = _sparse(layer, sel)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        y = sparse(x)
    activations = [t for t in saved if t.data_ptr() != sparse.weight.data_ptr()]
    assert len(activations) == 1 and activations[0].shape == (2, 2, 5, 5)
    assert torch.equal(activations[0], x.detach()[:, sel])  # the selected channels, and nothing of the others
    assert [t.shape for t in saved if t.data_ptr() == sparse.weight.data_ptr()] == [sparse.weight.shape]  # a reference
    y.sum().backward()
    # A frozen layer of the same shape keeps no activation at all, only the weight it passes dL/dx through.
    frozen, saved[:] = ChannelSparse(copy.deepcopy(layer), trainable=False), []
    with saved_tensors_hooks(pack, lambda t: t):
        frozen(x)
    assert [t.data_ptr() for t in saved] == [frozen.weight.data_ptr()]


def _sparse_nodes(loss):
    """The backward nodes of the sparse functions in a loss's graph."""
    seen, stack, nodes = set(), [loss.grad_fn], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ in ("_SparseConv2dBackward", "_SparseLinearBackward"):
            nodes.append(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return nodes


def test_what_a_model_step_keeps_equals_the_draws_activation_cost_and_the_analytic_count():
    task, module = _task(), Net()
    procedure = build(module, task, seed=0, budget=0.3)
    batch = task.batch(torch.arange(8))
    loss = task.loss(module, batch)
    kept = 0
    for node in _sparse_nodes(loss):
        activation, weight = node.saved_tensors
        assert activation is None or activation.data_ptr() != weight.data_ptr()
        kept += 0 if activation is None else activation.numel()
    draw = procedure.history[-1]
    assert kept == 8 * draw["activations"] > 0
    memory = procedure.analytic_memory(batch)
    assert memory["activations"] == 4 * kept and memory["gradients"] == 4 * draw["weights"]
    assert draw["budgeted"] <= procedure.budget == memory["budget_elements"]


def test_the_budget_fill_stops_before_the_draw_that_would_exceed_it():
    costs = torch.tensor([5, 3, 4, 2, 6])
    assert fill_budget(torch.tensor([1, 0, 2, 3, 4]), costs, 12).tolist() == [1, 0, 2]  # 3+5+4 = 12; +2 = 14 > 12
    assert fill_budget(torch.tensor([4, 1]), costs, 5).tolist() == []  # the first draw already exceeds
    geo = {"a": LayerGeometry("a", "conv", 8, 4, 9, 16, 16), "b": LayerGeometry("b", "linear", 3, 10, 1, 1, 1)}
    pool = UnitPool.build(geo, ["a", "b"])
    budget = 200
    for epoch in range(20):
        chosen = random_selection(pool, budget, seed=3, epoch=epoch)
        order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(__import__("rankwise.recipes.trady.selection",
                               fromlist=["draw_key"]).draw_key(3, epoch)))
        cost = int(pool.cost[chosen].sum())
        assert cost <= budget
        if len(chosen) < len(pool):  # the next unit of the same order would not have fit
            assert cost + int(pool.cost[order[len(chosen)]]) > budget


def test_draws_are_reproducible_differ_between_epochs_and_are_uniform():
    from scipy.stats import chisquare

    geo = {"a": LayerGeometry("a", "linear", 4, 30, 1, 1, 1), "b": LayerGeometry("b", "linear", 4, 30, 1, 1, 1)}
    pool = UnitPool.build(geo, ["a", "b"])  # 60 units of equal cost 5: 10 fit a budget of 50
    first = random_selection(pool, 50, seed=7, epoch=0)
    assert torch.equal(first, random_selection(pool, 50, seed=7, epoch=0)) and first.numel() == 10
    assert not torch.equal(first.sort().values, random_selection(pool, 50, seed=7, epoch=1).sort().values)
    counts = torch.zeros(len(pool))
    for epoch in range(600):
        counts[random_selection(pool, 50, seed=7, epoch=epoch)] += 1
    assert chisquare(counts.numpy()).pvalue > 1e-3  # each unit drawn in 1/6 of the epochs, up to noise


def test_frozen_channels_stay_bit_identical_and_the_model_comes_back_as_it_was():
    task, module = _task(), Net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    names = [n for n, p in module.named_parameters()]
    procedure = build(module, task, seed=1, budget=0.2, resample_every=2)
    drawn = {n: torch.zeros(procedure.layers[n].units, dtype=torch.bool) for n in procedure.pool_layers}
    seen = []

    class Watch(Procedure):  # records every draw's channels, forwarding the hooks to TraDy
        name = procedure.name
        resumable = False

        def before_micro_batch(self, step, micro):
            procedure.before_micro_batch(step, micro)
            seen.append(procedure.epoch)
            for n, index in procedure.selected().items():
                drawn[n][index] = True

        def after_step(self, *args):
            procedure.after_step(*args)

        def end_of_training(self, m):
            procedure.end_of_training(m)

    train(module, task, TrainConfig(steps=6, batch_size=8, lr=0.5, warmup_ratio=0.0), procedure=Watch(), optimizer=sgd())
    assert sorted(set(seen)) == [0, 1, 2] and len(procedure.history) == 3
    assert [n for n, _ in module.named_parameters()] == names  # the original layers are back, no slice bank
    assert isinstance(module.body[0], nn.Conv2d) and all(p.requires_grad for p in module.parameters())
    after = module.state_dict()
    assert set(after) == set(before)
    for name in procedure.pool_layers:
        w0, w1 = before[f"{name}.weight"], after[f"{name}.weight"]
        never = ~drawn[name]
        assert torch.equal(w1[:, never], w0[:, never])  # channels no draw picked: bit-identical
        if drawn[name].any():
            assert not torch.equal(w1[:, drawn[name]], w0[:, drawn[name]])
    for key in ("body.1.running_mean", "body.1.running_var", "body.1.weight", "body.3.bias"):
        assert torch.equal(after[key], before[key])  # batch-norm statistics and affine, biases: frozen
    assert not torch.equal(after["head.weight"], before["head.weight"])  # the head trains densely


def test_with_every_layer_and_the_whole_budget_trady_is_full_fine_tuning():
    task = _task()
    config = TrainConfig(steps=4, batch_size=8, lr=0.3, warmup_ratio=0.0)
    a = Net()
    build_and_train = build(a, task, seed=0, budget=1.0)
    train(a, task, config, procedure=build_and_train, optimizer=sgd())
    b = Net()
    b.requires_grad_(False)
    for m in b.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.weight.requires_grad_(True)
    b.head.requires_grad_(True)

    class FrozenNorms(Procedure):
        name = "frozen-norms"

        def before_micro_batch(self, step, micro):
            b.body[1].eval()

    train(b, task, config, procedure=FrozenNorms(), optimizer=sgd())
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_the_same_seed_gives_the_same_run():
    losses = []
    for _ in range(2):
        task, module = _task(), Net()
        p = build(module, task, seed=5, budget=0.1, resample_every=1)
        losses.append(train(module, task, TrainConfig(steps=4, batch_size=8, lr=0.2), procedure=p, optimizer=sgd()).losses)
    assert losses[0] == losses[1]


@pytest.mark.parametrize("rule", ["rgn", "velocity"])
def test_the_baseline_rules_stay_within_their_budgets(rule):
    task, module = _task(), Net()
    p = build(module, task, seed=0, budget=0.1, selection=rule, resample_every=2, oracle_examples=16, velocity_examples=16)
    train(module, task, TrainConfig(steps=4, batch_size=8, lr=0.2), procedure=p, optimizer=sgd())
    assert len(p.history) == 2 and all(h["budgeted"] <= p.budget for h in p.history)
    if rule == "velocity":  # output neurons: a touched layer keeps its whole input (the paper's point about Velocity)
        assert p.history[-1]["activations"] > 0 and p.history[-1]["budgeted"] == p.history[-1]["weights"]


def test_a_ranking_from_a_proxy_task_picks_the_pool(tmp_path):
    proxy, module = _task(seed=9), Net()
    ranking = rank_layers(module, proxy, TrainConfig(steps=3, batch_size=8, lr=0.1))
    assert set(ranking.scores) == {"body.0", "body.3", "body.5", "fc"} and all(v > 0 for v in ranking.scores.values())
    kept = ranking.select(0.97)
    assert kept == ranking.order()[: len(kept)] and ranking.select(1e-9) == ranking.order()[:1]
    ranking.save(tmp_path / "r.json")
    assert load_ranking(tmp_path / "r.json").scores == ranking.scores
    p = build(Net(), _task(), seed=0, ranking=str(tmp_path / "r.json"), keep=0.97)
    assert p.pool_layers == [n for n in ["body.0", "body.3", "body.5", "fc"] if n in kept]


def test_velocity_is_zero_for_unchanged_outputs_and_grows_with_change():
    tracker = VelocityTracker(["a"], momentum=0.5)
    y = torch.randn(4, 3, 5)
    assert tracker.observe({"a": y}) is None
    assert tracker.observe({"a": y.clone()})["a"].abs().max() < 1e-12  # cos = 1 up to float64 rounding
    moved = y.clone()
    moved[:, 1] = torch.randn(4, 5)
    v = tracker.observe({"a": moved})["a"]
    assert v[1].abs() > 1e-3 and v[0].abs() < 1e-12 and v[2].abs() < 1e-12


@pytest.mark.parametrize("options, match", [
    ({"budget": 0.0}, r"budget is a share .* in \(0, 1\]"), ({"budget": 1.5}, r"in \(0, 1\]"),
    ({"keep": 0.0}, r"keep is a share"), ({"keep": 1.2}, r"keep is a share"),
    ({"resample_every": 0}, "counts steps"), ({"ranking": "/no/such.json"}, "is not a file"),
])
def test_bad_options_are_refused_before_any_model_work(options, match):
    with pytest.raises(InvalidInputError, match=match):
        TradyConfig(**options).validate()


def test_bad_input_is_refused_before_training():
    task = _task()
    with pytest.raises(InvalidInputError, match="fits no unit"):
        build(Net(), task, 0, budget_elements=5)
    with pytest.raises(InvalidInputError, match="BatchNorm2d, not an nn.Linear or nn.Conv2d"):
        build(Net(), task, 0, layers="body.1")
    with pytest.raises(InvalidInputError, match="part of the head"):
        build(Net(), task, 0, layers="head")
    with pytest.raises(InvalidInputError, match="not a submodule"):
        build(Net(), task, 0, layers="body.9")

    class NoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x.mean(dim=(1, 2))[:, :1].expand(-1, 3) * self.scale

    with pytest.raises(InvalidInputError, match="nothing to select channels from"):
        build(NoLayers(), task, 0)
    module = Net()
    state = copy.deepcopy(module.state_dict())
    with pytest.raises(InvalidInputError, match="fits no unit"):
        build(module, task, 0, budget_elements=5)
    assert all(torch.equal(v, state[k]) for k, v in module.state_dict().items())  # refused before touching it


def test_a_layer_whose_output_the_loss_ignores_is_not_in_the_pool():
    class WithUnusedBranch(Net):  # like BERT's pooler under a mean-pooling head: it runs, nothing reads it
        def __init__(self):
            super().__init__()
            self.unused = nn.Linear(6, 4)

        def forward(self, x):
            features = self.body(x).mean(dim=(2, 3))
            self.unused(features)
            return self.head(torch.relu(self.fc(features)))

    task = _task()
    p = build(WithUnusedBranch(), task, 0, budget=0.2)
    assert "unused" not in p.pool_layers and "fc" in p.pool_layers
    with pytest.raises(InvalidInputError, match="output is unused"):
        build(WithUnusedBranch(), task, 0, layers="unused")
