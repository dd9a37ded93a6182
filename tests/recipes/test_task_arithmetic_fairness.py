"""Task arithmetic and group fairness (card task-arithmetic-fairness.md): the card's invariants, the metrics against
fairlearn, and bad input refused before any work."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError, RankwiseError
from rankwise.recipes.task_arithmetic import (TaskVector, add_vectors, demographic_parity_difference,
                                              equalized_odds_difference, fairness_bound, fairness_metrics, inject,
                                              lambda_sweep, lora_task_vector, merge_per_group, scale_sum, select_point,
                                              subgroup_task_vectors, task_vector, worst_group)

pytestmark = pytest.mark.method("task-arithmetic-fairness")


class MLP(nn.Module):
    def __init__(self, seed: int = 0, bn: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2, self.head = nn.Linear(5, 8), nn.Linear(8, 8), nn.Linear(8, 2)
        self.norm = nn.BatchNorm1d(8) if bn else nn.Identity()

    def forward(self, x):
        return self.head(torch.relu(self.fc2(self.norm(torch.relu(self.fc1(x))))))


def perturbed(model: nn.Module, seed: int, scale: float = 0.1) -> nn.Module:
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return out


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# ------------------------------------------------------------------------------------------------ vectors, merging

def test_lambda_zero_is_base_exactly_and_linear_in_lambda():
    base = MLP(0)
    vectors = [task_vector(base, perturbed(base, s)) for s in (1, 2, 3)]
    theta0 = base.state_dict()
    assert all(torch.equal(scale_sum(theta0, vectors, 0.0)[k], theta0[k]) for k in theta0)
    # theta(lam) - theta_0 is linear: theta(0.6) - theta_0 = 2 (theta(0.3) - theta_0), up to float32 rounding of
    # weights of size ~1 (one rounding per result: |error| <= 2 ulp(1) ~ 2.4e-7, the card's 1e-7 in float64 below)
    d3 = {k: scale_sum(theta0, vectors, 0.3)[k].double() - theta0[k].double() for k in theta0}
    d6 = {k: scale_sum(theta0, vectors, 0.6)[k].double() - theta0[k].double() for k in theta0}
    assert max(float((d6[k] - 2 * d3[k]).abs().max()) for k in theta0) <= 4 * torch.finfo(torch.float32).eps
    base64 = {k: v.double() for k, v in theta0.items()}
    e3 = {k: scale_sum(base64, vectors, 0.3)[k] - base64[k] for k in theta0}
    e6 = {k: scale_sum(base64, vectors, 0.6)[k] - base64[k] for k in theta0}
    assert max(float((e6[k] - 2 * e3[k]).abs().max()) for k in theta0) <= 1e-12


def test_one_vector_at_lambda_one_is_the_finetuned_model_exactly():
    base, ft = MLP(0), perturbed(MLP(0), 7, scale=0.5)
    merged = scale_sum(base.state_dict(), [task_vector(base, ft)], 1.0)
    assert all(torch.equal(merged[k], v) for k, v in ft.state_dict().items())
    assert all(torch.equal(inject(base.state_dict(), task_vector(base, ft), 1.0)[k], v)
               for k, v in ft.state_dict().items())


def test_sum_and_mean_parametrisations():
    base = MLP(0)
    vectors = [task_vector(base, perturbed(base, s)) for s in (1, 2, 3, 4)]
    theta0 = {k: v.double() for k, v in base.state_dict().items()}  # float64: compare the parametrisations exactly
    # lambda_g = 1 for every g is the mean, i.e. the sum at lam = 1/G
    assert max_diff(merge_per_group(theta0, vectors, [1.0] * 4), scale_sum(theta0, vectors, 0.25)) <= 1e-15
    # per-group lambdas are each group's coefficient / G
    lams = [0.5, 2.0, 1.0, 0.5]
    expect = add_vectors(theta0, vectors, [x / 4 for x in lams])
    assert max_diff(merge_per_group(theta0, vectors, lams), expect) == 0.0


def test_integer_buffers_are_skipped_and_copied():
    base = MLP(0, bn=True)
    ft = perturbed(base, 1)
    ft.norm.num_batches_tracked += 5
    tau = task_vector(base, ft)
    assert "norm.num_batches_tracked" not in tau.keys() and "norm.running_mean" in tau.keys()
    merged = scale_sum(base.state_dict(), [tau], 1.0)
    assert merged["norm.num_batches_tracked"].dtype == torch.int64
    assert torch.equal(merged["norm.num_batches_tracked"], base.state_dict()["norm.num_batches_tracked"])
    assert set(merged) == set(base.state_dict())


def test_lora_delta_equals_merged_weight_difference():
    from peft import LoraConfig, get_peft_model

    base = MLP(0)
    theta0 = copy.deepcopy(base.state_dict())
    torch.manual_seed(3)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, lora_alpha=5, target_modules=["fc1", "fc2", "head"]))
    with torch.no_grad():  # B is zero at init: give it values so the delta is not trivially 0
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    tau = lora_task_vector(model)
    assert sorted(tau.keys()) == ["fc1.weight", "fc2.weight", "head.weight"]
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    diff = {k: merged[k].double() - theta0[k].double() for k in tau.keys()}
    for k, d in tau.deltas.items():
        # peft merges in float32 (W + s B A): one rounding of terms of size |W| + |dW|, a few ulps
        tol = 8 * torch.finfo(torch.float32).eps * float(merged[k].abs().max())
        assert float((d - diff[k]).abs().max()) <= tol
        assert float(d.abs().max()) > 100 * tol  # the delta is not trivially small
    ours = scale_sum(theta0, [tau], 1.0)
    x = torch.randn(16, 5)
    with torch.no_grad():
        out_peft, out_ours = model(x), torch.func.functional_call(base, ours, (x,))
    assert torch.allclose(out_peft, out_ours, atol=1e-5, rtol=1e-5)


def test_subgroup_vectors_start_from_the_same_base():
    base = MLP(0)
    before = copy.deepcopy(base.state_dict())
    groups = torch.tensor([0, 0, 1, 2, 2, 2])
    seen = []

    def finetune(model, rows):  # a deterministic "training" that depends on the rows
        seen.append(rows.tolist())
        with torch.no_grad():
            model.head.bias.add_(float(rows.numel()))

    vectors = subgroup_task_vectors(base, groups, finetune)
    assert seen == [[0, 1], [2], [3, 4, 5]]
    assert max_diff(base.state_dict(), before) == 0.0
    for g, n in ((0, 2), (1, 1), (2, 3)):
        # bias + n rounds once in float32 (|bias| < 1): the delta is n within one ulp of n + 1
        tol = 2 * torch.finfo(torch.float32).eps * (n + 1)
        assert float((vectors[g].deltas["head.bias"] - n).abs().max()) <= tol
        assert vectors[g].norm() == pytest.approx(n * 2 ** 0.5, abs=2 * tol)
    assert worst_group(torch.tensor([0.1, 0.5, 0.3])) == 1
    assert worst_group(torch.tensor([0.1, 0.5, 0.3]), exclude=[1]) == 2


def test_fairness_bound_is_zero_at_balance_and_grows():
    norms = [0.5, 2.0, 1.0]
    assert fairness_bound([1.0, 1.0, 1.0], norms, lipschitz=3.0) == 0.0
    values = [fairness_bound([1.0, 1.0 + d, 1.0 - d], norms) for d in (0.0, 0.1, 0.2, 0.4)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert fairness_bound([1.0, 1.5, 1.0], norms) == pytest.approx(2 * 0.5 * 2.0)


# ------------------------------------------------------------------------------------------------------- metrics

def _random_case(seed: int, n: int = 400, g: int = 4):
    gen = torch.Generator().manual_seed(seed)
    while True:
        y = torch.randint(0, 2, (n,), generator=gen)
        p = torch.randint(0, 2, (n,), generator=gen)
        groups = torch.randint(0, g, (n,), generator=gen)
        ok = all(((groups == k) & (y == c)).any() for k in range(g) for c in (0, 1))
        if ok:
            return y, p, groups


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_metrics_equal_fairlearn(seed):
    fl = pytest.importorskip("fairlearn.metrics")
    y, p, g = _random_case(seed, n=50 + 97 * seed, g=2 + seed)
    ours_dp, ours_eo = demographic_parity_difference(p, g), equalized_odds_difference(y, p, g)
    ref_dp = fl.demographic_parity_difference(y.numpy(), p.numpy(), sensitive_features=g.numpy())
    ref_eo = fl.equalized_odds_difference(y.numpy(), p.numpy(), sensitive_features=g.numpy())
    assert abs(ours_dp - ref_dp) <= 1e-12 and abs(ours_eo - ref_eo) <= 1e-12
    m = fairness_metrics(y, p, g)
    frame = fl.MetricFrame(metrics={"acc": lambda a, b: float(np.mean(a == b))}, y_true=y.numpy(), y_pred=p.numpy(),
                           sensitive_features=g.numpy())
    assert np.allclose(m.group_accuracy.numpy(), frame.by_group["acc"].to_numpy(), atol=1e-12, rtol=0)
    assert m.worst_group_accuracy == pytest.approx(float(frame.by_group["acc"].min()), abs=1e-12)


def test_metric_invariances_and_ranges():
    y, p, g = _random_case(5, n=300, g=3)
    m = fairness_metrics(y, p, g)
    assert 0.0 <= m.dpd <= 1.0 and 0.0 <= m.eod <= 1.0 and m.equal_opportunity <= m.eod
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(1))
    relabel = torch.tensor([2, 0, 1])[g]  # renaming groups changes nothing between groups
    assert fairness_metrics(y[perm], p[perm], g[perm]).dpd == pytest.approx(m.dpd, abs=1e-15)
    assert fairness_metrics(y, p, relabel).eod == pytest.approx(m.eod, abs=1e-15)
    # predictions independent of the group by construction: the same rate in every group gives DPD = 0
    groups = torch.arange(300) % 3
    pred = (torch.arange(300) // 3) % 2
    assert demographic_parity_difference(pred, groups) == 0.0
    # a classifier that predicts the label is perfectly equalised
    assert equalized_odds_difference(y, y.clone(), g) == 0.0


def test_sweep_selects_the_fairest_accurate_point():
    base = MLP(0)
    vectors = [task_vector(base, perturbed(base, 1))]

    class M:
        def __init__(self, acc, gap):
            self.accuracy, self.gap = acc, gap

    table = {0.0: M(0.5, 0.0), 0.5: M(0.70, 0.2), 1.0: M(0.72, 0.4)}
    calls = iter(table.values())
    points = lambda_sweep(base, vectors, [0.0, 0.5, 1.0], lambda state: next(calls))
    assert select_point(points, min_accuracy=0.69).lam == 0.5  # the constant-like point is not accurate enough
    assert select_point(points, min_accuracy=0.80).lam == 1.0  # nothing feasible: the most accurate


# ---------------------------------------------------------------------------------------------------- bad input

def test_mismatched_state_dicts_are_refused():
    a, b = MLP(0), MLP(0)
    b.fc2 = nn.Linear(8, 3)
    with pytest.raises(InvalidInputError, match="fc2"):
        task_vector(a, b)
    sd = MLP(0).state_dict()
    sd.pop("head.bias")
    with pytest.raises(InvalidInputError, match="head.bias"):
        task_vector(MLP(0), sd)
    other = TaskVector({"fc9.weight": torch.zeros(2, 2, dtype=torch.float64)})
    with pytest.raises(InvalidInputError, match="fc9"):
        scale_sum(MLP(0).state_dict(), [other], 0.5)
    with pytest.raises(InvalidInputError):
        TaskVector({"fc1.weight": torch.zeros(2, 2)}) + other


def test_groups_with_no_member_are_refused():
    y, p = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 1, 1, 1])
    with pytest.raises(InvalidInputError, match="no member"):
        demographic_parity_difference(p, torch.tensor([0, 0, 2, 2]))
    with pytest.raises(InvalidInputError, match="no member"):
        fairness_metrics(y, p, torch.tensor([0, 0, 0, 0]), num_groups=2)
    with pytest.raises(InvalidInputError, match="no positive"):  # a TPR of no positives is not 0, it is undefined
        equalized_odds_difference(torch.tensor([0, 0, 0, 1]), p, torch.tensor([0, 0, 1, 1]))
    called = []
    with pytest.raises(InvalidInputError, match="no training row"):
        subgroup_task_vectors(MLP(0), torch.tensor([0, 0, 2]), lambda m, r: called.append(r), num_groups=3)
    assert called == []  # refused before any training


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "x"])
def test_lambda_not_finite_is_refused(bad):
    base = MLP(0)
    tau = task_vector(base, perturbed(base, 1))
    for call in (lambda: scale_sum(base, [tau], bad), lambda: inject(base.state_dict(), tau, bad),
                 lambda: merge_per_group(base, [tau], [bad]), lambda: fairness_bound([bad], [1.0])):
        with pytest.raises(RankwiseError):
            call()
    evaluated = []
    with pytest.raises(InvalidInputError):
        lambda_sweep(base, [tau], [0.0, bad], lambda s: evaluated.append(s))
    assert evaluated == []


def test_non_finite_weights_and_bad_predictions_are_refused():
    base, ft = MLP(0), perturbed(MLP(0), 1)
    with torch.no_grad():
        ft.fc1.weight[0, 0] = float("nan")
    with pytest.raises(NumericalError):
        task_vector(base, ft)
    with pytest.raises(InvalidInputError, match="binary"):
        demographic_parity_difference(torch.tensor([0, 2, 1, 0]), torch.tensor([0, 0, 1, 1]))
    with pytest.raises(InvalidInputError, match="same"):
        equalized_odds_difference(torch.tensor([0, 1]), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 1]))
    with pytest.raises(InvalidInputError, match="coefficients"):
        add_vectors(base, [task_vector(base, perturbed(base, 2))], [1.0, 2.0])
