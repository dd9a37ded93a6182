"""EMAC-AUTTA: the card's invariants — the SVD split reconstructs the classifier and its bases are orthonormal, the
energies of a unit feature sum to 1, the mixture's means are ordered and its partition disjoint and covering, the
budget is never exceeded over a stream, EMAC selects only from X_mix, the contrastive loss is finite and falls as
positives move closer, B = 0 equals the unsupervised part, the reward signs — and bad input refused before work."""

import math

import pytest
import torch
from torch import nn

from rankwise.apps.vision.emac import (MIX, NEW, OLD, UNKNOWN, BudgetSchedule, EmacConfig, EnergyMixture, RewardTracker,
                                       adapt_stream, clustering_contrastive_loss, fit_mixture, mme_loss, open_set_scores,
                                       partition, prototypes, select_badge, select_coreset, select_emac, select_entropy,
                                       select_random, select_simatta, split_classifier)
from rankwise.errors import InvalidInputError, RankwiseError

pytestmark = pytest.mark.method("emac-autta")


class Net(nn.Module):
    """A tiny CNN with batch norm, features D = 12 > C = 3 classes."""

    def __init__(self, classes: int = 3, width: int = 12):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(1, 6, 3, 1, 1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, width, 3, 2, 1),
                                  nn.BatchNorm2d(width), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(x))


def stream(n=96, seed=0, classes=3):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(-1, classes, (n,), generator=g)


# -- the split -------------------------------------------------------------------------------------------------------

def test_split_reconstructs_classifier_and_bases_are_orthonormal():
    w = torch.randn(4, 10, dtype=torch.float64)
    s = split_classifier(w)
    assert s.known.shape == (10, 4) and s.unknown.shape == (10, 6)
    torch.testing.assert_close(w @ s.projector_known(), w, atol=1e-12, rtol=0)  # W = W P_known
    basis = torch.cat([s.known, s.unknown], 1)
    torch.testing.assert_close(basis.T @ basis, torch.eye(10, dtype=torch.float64), atol=1e-12, rtol=0)
    assert float((s.known.T @ s.unknown).abs().max()) < 1e-12
    torch.testing.assert_close(w @ s.unknown, torch.zeros(4, 6, dtype=torch.float64), atol=1e-12, rtol=0)


def test_energies_of_unit_features_sum_to_one_and_see_the_row_space():
    w = torch.randn(3, 8)
    s = split_classifier(w)
    known, unknown = s.energies(torch.randn(50, 8) * 7.0)
    torch.testing.assert_close(known + unknown, torch.ones(50, dtype=torch.float64), atol=1e-12, rtol=0)
    in_row_space = s.unknown_energy(torch.randn(5, 3) @ w)
    assert float(in_row_space.max()) < 1e-10
    assert float(s.unknown_energy(s.unknown.T[:2].float()).min()) > 1 - 1e-6


def test_split_refuses_c_not_below_d_and_rank_deficiency():
    with pytest.raises(InvalidInputError, match="larger than the number of known classes"):
        split_classifier(torch.randn(8, 8))
    with pytest.raises(InvalidInputError, match="rank"):
        split_classifier(torch.ones(3, 8))


# -- the mixture -----------------------------------------------------------------------------------------------------

def test_mixture_means_ordered_and_partition_disjoint_and_covering():
    g = torch.Generator().manual_seed(1)
    e = torch.cat([0.8 + 0.03 * torch.randn(40, generator=g), 0.2 + 0.03 * torch.randn(60, generator=g)]).double()
    p = fit_mixture(e.numpy())
    assert p.mu_old < p.mu_new and abs(p.mu_old - 0.2) < 0.05 and abs(p.mu_new - 0.8) < 0.05
    region = partition(e, p)
    masks = [region == r for r in (OLD, MIX, NEW)]
    assert sum(int(m.sum()) for m in masks) == e.numel()  # covering
    assert not any((masks[i] & masks[j]).any() for i in range(3) for j in range(i + 1, 3))  # disjoint
    assert bool((e[masks[0]] < p.mu_old).all() and (e[masks[2]] > p.mu_new).all())
    post = p.posterior_new(torch.tensor([0.2, 0.8]))
    assert post[0] < 0.5 < post[1]


def test_mixture_keeps_last_good_fit_on_a_single_mode_window():
    m = EnergyMixture(window=64, ema=1.0, min_weight=0.05)
    g = torch.Generator().manual_seed(2)
    good = m.update(torch.cat([0.2 + 0.02 * torch.randn(32, generator=g), 0.8 + 0.02 * torch.randn(32, generator=g)]))
    for _ in range(3):  # a stretch of the stream with no new classes fills the window with one mode
        after = m.update(torch.full((64,), 0.5) + 1e-4 * torch.randn(64, generator=g))
    assert m.fallbacks >= 1 and after == good


# -- losses ------------------------------------------------------------------------------------------------------------

def test_contrastive_loss_finite_and_falls_when_positives_move_closer():
    g = torch.Generator().manual_seed(3)
    labels = torch.tensor([0, 0, 1, 1, UNKNOWN, UNKNOWN])
    centres = torch.randn(3, 16, generator=g)
    noise = torch.randn(6, 16, generator=g)
    base = centres[torch.tensor([0, 0, 1, 1, 2, 2])]
    far = clustering_contrastive_loss(base + 2.0 * noise, labels, 2, tau=0.1)
    near = clustering_contrastive_loss(base + 0.2 * noise, labels, 2, tau=0.1)
    assert math.isfinite(float(far)) and math.isfinite(float(near)) and float(near) < float(far)
    z = (base + noise).requires_grad_(True)
    clustering_contrastive_loss(z, labels, 2).backward()
    assert torch.isfinite(z.grad).all() and float(z.grad.abs().sum()) > 0


def test_prototypes_use_the_sum_normaliser():
    z = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    protos, present = prototypes(z, torch.tensor([0, 0, UNKNOWN]), 2)
    torch.testing.assert_close(protos[0], torch.tensor([2.0, 0.0]))  # (1 + 3) / (|F_p| + |F_a|) = 4 / 2
    assert present.tolist() == [True, False]


def test_mme_loss_sign():
    confident, flat = torch.tensor([[10.0, 0.0, 0.0]]), torch.zeros(1, 3)
    logits = torch.cat([confident, flat])
    old, new = torch.tensor([True, False]), torch.tensor([False, True])
    assert float(mme_loss(logits, old, new)) < 0 < float(mme_loss(logits, new, old))


# -- selection and the budget --------------------------------------------------------------------------------------------

def test_reward_signs():
    g_old, g_new = RewardTracker.gammas(h_old_before=1.0, h_old_after=0.6, h_new_before=0.9, h_new_after=1.3)
    assert g_old > 0 and g_new > 0  # old entropy fell, new entropy rose: both rewarded
    g_old, g_new = RewardTracker.gammas(0.6, 1.0, 1.3, 0.9)
    assert g_old < 0 and g_new < 0
    t = RewardTracker(alpha=1.0)
    t.update(0.5, -0.1)
    assert t.prefer_old()


def test_selectors_pick_only_candidates_at_most_k():
    g = torch.Generator().manual_seed(4)
    n = 20
    cand = torch.rand(n, generator=g) > 0.5
    h, p_new = torch.rand(n, generator=g), torch.rand(n, generator=g)
    feats, probs = torch.randn(n, 6, generator=g), torch.softmax(torch.randn(n, 3, generator=g), 1)
    picks = [select_emac(cand, 3, h, p_new, True), select_emac(cand, 3, h, p_new, False), select_random(cand, 3, g),
             select_entropy(cand, 3, h), select_coreset(cand, 3, feats, feats[:2]), select_badge(cand, 3, feats, probs, g),
             select_simatta(cand, 3, feats, h, torch.zeros(0, 6))]
    for chosen in picks:
        assert chosen.numel() <= 3 and len(set(chosen.tolist())) == chosen.numel() and bool(cand[chosen].all())
    old = cand & (p_new <= 0.5)
    if old.any():  # EMAC preferring old: the highest-entropy old-assigned candidate first
        assert int(picks[0][0]) == int(old.nonzero().squeeze(1)[h[old].argmax()])


def test_budget_schedule_never_exceeds_total():
    s = BudgetSchedule(7, 30)
    for t in range(30):
        s.spend(s.allowance(t))
    assert s.spent == 7
    with pytest.raises(InvalidInputError):
        s.spend(1)


# -- the stream ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("selector", ["emac", "random", "entropy", "coreset", "badge"])
def test_budget_never_exceeded_over_a_stream(selector):
    x, y = stream(n=200)
    r = adapt_stream(Net(), x, y, EmacConfig(budget=0.05, selector=selector, batch_size=16))
    assert r.annotations <= r.budget == 10 and int(r.annotated.sum()) == r.annotations
    assert math.isfinite(r.scores["known_acc"]) and r.diverged is None


def test_emac_selects_only_from_x_mix_and_the_ablation_does_not_have_to():
    x, y = stream(n=200, seed=5)
    r = adapt_stream(Net(), x, y, EmacConfig(budget=0.1, batch_size=16))
    assert r.annotations > 0 and bool((r.regions[r.annotated] == MIX).all())
    ablation = adapt_stream(Net(), x, y, EmacConfig(budget=0.1, batch_size=16, restrict_to_mix=False))
    assert ablation.annotations > 0 and bool((ablation.regions[ablation.annotated] != MIX).any())


def test_budget_zero_equals_the_unsupervised_part():
    x, y = stream(n=96, seed=6)
    a = adapt_stream(Net(), x, y, EmacConfig(budget=0.0, batch_size=16))
    b = adapt_stream(Net(), x, y, EmacConfig(budget=0.0, selector="random", batch_size=16))
    assert a.annotations == 0 and torch.equal(a.predictions, b.predictions)
    for (k, v), w in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(v, w), k


def test_the_model_passed_in_is_not_changed_and_runs_repeat():
    net = Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x, y = stream(n=64, seed=7)
    a = adapt_stream(net, x, y, EmacConfig(batch_size=16))
    b = adapt_stream(net, x, y, EmacConfig(batch_size=16))
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert torch.equal(a.predictions, b.predictions)


def test_h_score():
    truth = torch.tensor([0, 1, UNKNOWN, UNKNOWN])
    s = open_set_scores(torch.tensor([0, 2, UNKNOWN, 0]), truth)
    assert s["known_acc"] == 50.0 and s["unknown_acc"] == 50.0 and s["h_score"] == 50.0


# -- bad input ---------------------------------------------------------------------------------------------------------------

def test_bad_input_is_refused_before_work():
    net, (x, y) = Net(), stream(n=32)
    cases = [
        (dict(images=x[:0], oracle=y[:0]), "empty"),
        (dict(images=x * 3.0, oracle=y), r"\[0, 1\]"),
        (dict(images=x[:, 0], oracle=y), r"\[N, C, H, W\]"),
        (dict(images=x, oracle=y[:5]), "oracle labels"),
        (dict(images=x, oracle=torch.full_like(y, 7)), "oracle labels must lie"),
    ]
    for kwargs, message in cases:
        with pytest.raises(RankwiseError, match=message):
            adapt_stream(net, **kwargs)
    for budget in (-0.1, 1.5):
        with pytest.raises(InvalidInputError, match="budget"):
            adapt_stream(net, x, y, EmacConfig(budget=budget))
    with pytest.raises(InvalidInputError, match="no linear classifier"):
        adapt_stream(nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten()), x, y)
    with pytest.raises(InvalidInputError, match="larger than the number of known classes"):
        adapt_stream(Net(classes=12, width=12), x, y)
    with pytest.raises(InvalidInputError, match="uses no labels"):
        EmacConfig(loss="tent", selector="random").validate()
