"""Multi-task LoRA balancing and the trigger scan (card multitask-lora-trigger.md): the card's invariants for
uncertainty weighting (value and gradient at sigma^2 = 1, stationarity) and PCGrad (orthogonal after projection in
float64, non-conflicting pairs untouched, one task = identity, N = 2 update never against an original gradient),
our PCGrad against torchjd's, the balancer's gradients and its stacking warning, the scan flagging a constructed
canary and not a clean adapter, and bad input refused before any work."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from rankwise.adapters.trigger_scan import ScanConfig, calibrate_threshold, trigger_scan
from rankwise.errors import RankwiseError
from rankwise.recipes.multitask import (MultiTaskBalancer, MultiTaskConfig, StackingWarning, UncertaintyWeighting,
                                        conflict_stats, lora_parameters, pcgrad, pcgrad_project, stack_losses,
                                        stationary_variance)

pytestmark = pytest.mark.method("multitask-lora-trigger")


def _losses(x: torch.Tensor) -> list[torch.Tensor]:
    """Three smooth losses of one parameter vector x [4] with different scales."""
    return [(x ** 2).sum(), 10.0 * (x - 1.0).pow(2).sum(), 0.1 * x.sin().sum() + 1.0]


# ------------------------------------------------------------------------------------------- uncertainty weighting

def test_uw_at_unit_variance_is_half_sum_plus_n_log2_value_and_gradient():
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    uw = UncertaintyWeighting(3).double()
    assert torch.allclose(uw.variances(), torch.ones(3, dtype=torch.float64), atol=1e-12)
    total = uw(_losses(x))
    expected = 0.5 * sum(_losses(x)) + 3 * math.log(2.0)
    assert torch.allclose(total, expected, atol=1e-12)
    (g_uw,) = torch.autograd.grad(total, x)
    (g_ref,) = torch.autograd.grad(0.5 * sum(_losses(x)), x)
    assert torch.allclose(g_uw, g_ref, atol=1e-12)


@pytest.mark.parametrize("loss", [0.05, 0.7, 2.5, 100.0])
def test_uw_stationary_where_sigma4_over_1_plus_sigma2_is_half_loss(loss):
    s2 = stationary_variance(loss)
    assert s2 ** 2 / (1 + s2) == pytest.approx(loss / 2, rel=1e-12)
    uw = UncertaintyWeighting(1).double()
    with torch.no_grad():  # softplus^-1(s2)
        uw.rho.fill_(math.log(math.expm1(s2)))
    (g,) = torch.autograd.grad(uw([torch.tensor(loss, dtype=torch.float64)]), uw.rho)
    assert abs(float(g)) < 1e-10
    with torch.no_grad():
        uw.rho.fill_(math.log(math.expm1(2 * s2)))  # away from it the gradient does not vanish (the test can fail)
    (g2,) = torch.autograd.grad(uw([torch.tensor(loss, dtype=torch.float64)]), uw.rho)
    assert abs(float(g2)) > 1e-4


def test_uw_rho_group_has_no_weight_decay():
    group = UncertaintyWeighting(2).param_group(0.1)
    assert group["weight_decay"] == 0.0 and group["lr"] == 0.1


# ------------------------------------------------------------------------------------------------------- PCGrad

def test_pcgrad_conflicting_pair_becomes_orthogonal_float64():
    g = torch.tensor([[1.0, 0.5, -2.0], [-1.5, 1.0, 1.0]], dtype=torch.float64)
    assert g[0] @ g[1] < 0
    p = pcgrad_project(g, torch.Generator().manual_seed(0))
    assert abs(float(p[0] @ g[1])) < 1e-12 and abs(float(p[1] @ g[0])) < 1e-12


def test_pcgrad_leaves_non_conflicting_gradients_unchanged():
    g = torch.tensor([[1.0, 0.5, 2.0], [0.5, 1.0, 0.1], [0.2, 0.0, 1.0]], dtype=torch.float64)
    assert (g @ g.T >= 0).all()
    assert torch.equal(pcgrad_project(g, torch.Generator().manual_seed(1)), g)


def test_pcgrad_single_task_is_identity():
    g = torch.randn(1, 7, dtype=torch.float64)
    assert torch.equal(pcgrad(g), g[0])


def test_pcgrad_two_tasks_update_never_against_an_original_gradient():
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        g = torch.randn(2, 5, dtype=torch.float64, generator=gen)
        u = pcgrad(g, gen)
        assert float(u @ g[0]) >= -1e-12 and float(u @ g[1]) >= -1e-12


@pytest.mark.parametrize("n", [2, 3, 5])
def test_pcgrad_equals_torchjd_pcgrad(n):
    """Both draw the visiting order as torch.randperm(N) per task from the global RNG and skip the task itself, so
    under the same seed they visit in the same order; torchjd works on the Gramian (weights x G), we on the rows, so
    they agree to float64 rounding. (torchjd would divide by a zero ||g_m||^2, we skip a zero row: not exercised.)"""
    aggregation = pytest.importorskip("torchjd.aggregation")
    g = torch.randn(n, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    g[1] = -0.8 * g[0] + 0.1 * g[1]  # make sure some pair conflicts
    torch.manual_seed(7)
    ours = pcgrad(g)
    torch.manual_seed(7)
    theirs = aggregation.PCGrad()(g)
    assert torch.allclose(ours, theirs.to(ours.dtype), atol=1e-10, rtol=1e-10)


def test_conflict_stats_counts_negative_pairs():
    g = torch.tensor([[1.0, 0.0], [-1.0, 0.1], [0.0, 1.0]])
    st = conflict_stats(g)
    assert (st.conflicting_pairs, st.pairs, st.any_conflict) == (1, 3, True)


# ------------------------------------------------------------------------------------------------------ balancer

class TinyShared(nn.Module):
    """A PEFT-style module: a shared 'lora_A'/'lora_B' pair and two task heads."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lora_A, self.lora_B = nn.Linear(3, 2, bias=False), nn.Linear(2, 3, bias=False)
        self.heads = nn.ModuleList([nn.Linear(3, 1), nn.Linear(3, 1)])

    def forward(self, x):
        z = x + self.lora_B(self.lora_A(x))
        return [h(z).pow(2).mean() for h in self.heads]


def test_balancer_sum_matches_plain_backward_and_counts_conflicts():
    m, x = TinyShared(), torch.randn(8, 3)
    shared = lora_parameters(m)
    MultiTaskBalancer(shared, 2, MultiTaskConfig(), m.heads.parameters()).backward(m(x))
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    sum(m(x)).backward()
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(got, m.parameters()))


def test_balancer_uncertainty_gives_rho_a_gradient_and_stacking_warns():
    m, x = TinyShared(), torch.randn(8, 3)
    with pytest.warns(StackingWarning):
        b = MultiTaskBalancer(lora_parameters(m), 2, MultiTaskConfig("uncertainty", "pcgrad"), m.heads.parameters())
    b.backward(m(x))
    assert b.weighting.rho.grad is not None and torch.isfinite(b.weighting.rho.grad).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StackingWarning)  # a single method alone does not warn
        MultiTaskBalancer(lora_parameters(m), 2, MultiTaskConfig("uncertainty", "sum"))
        MultiTaskBalancer(lora_parameters(m), 2, MultiTaskConfig("sum", "pcgrad"))


@pytest.mark.parametrize("aggregator", ["mgda", "cagrad", "upgrad", "torchjd-pcgrad"])
def test_balancer_runs_torchjd_aggregators(aggregator):
    pytest.importorskip("torchjd.aggregation")
    m, x = TinyShared(), torch.randn(8, 3)
    MultiTaskBalancer(lora_parameters(m), 2, MultiTaskConfig(aggregator=aggregator), m.heads.parameters()).backward(m(x))
    assert all(torch.isfinite(p.grad).all() for p in lora_parameters(m))


def test_lora_parameters_of_a_real_peft_model():
    from peft import LoraConfig, get_peft_model

    from rankwise.models.tiny import tiny_bert

    model = get_peft_model(tiny_bert(), LoraConfig(r=2, target_modules=["query", "value"]))
    assert len(lora_parameters(model)) == 2 * 2 * 2  # 2 layers x (query, value) x (A, B)


# -------------------------------------------------------------------------------------------------- bad input

def test_bad_input_is_refused():
    with pytest.raises(RankwiseError):
        stack_losses([])
    with pytest.raises(RankwiseError):
        UncertaintyWeighting(0)
    m = TinyShared()
    with pytest.raises(RankwiseError):
        MultiTaskBalancer(lora_parameters(m), 0)
    b = MultiTaskBalancer(lora_parameters(m), 3)
    with pytest.raises(RankwiseError):  # two losses for three tasks
        b.backward(m(torch.randn(4, 3)))
    with pytest.raises(RankwiseError):  # not a LoRA model
        lora_parameters(nn.Sequential(nn.Linear(3, 3)))
    with pytest.raises(RankwiseError):
        MultiTaskConfig(aggregator="nash").validate()
    with pytest.raises(RankwiseError):
        pcgrad(torch.randn(3))
    with pytest.raises(RankwiseError):
        stationary_variance(0.0)


# ------------------------------------------------------------------------------------------------- trigger scan

class BagClassifier(nn.Module):
    """ids [B, T] -> logits [B, 4]: mean of token embeddings over the mask, then a linear head."""

    def __init__(self, emb: torch.Tensor, head: torch.Tensor):
        super().__init__()
        self.emb, self.head = nn.Parameter(emb), nn.Parameter(head)

    def forward(self, input_ids, attention_mask):
        e = self.emb[input_ids] * attention_mask[..., None]
        return (e.sum(1) / attention_mask.sum(1, keepdim=True)) @ self.head.T


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rankwise.models.minilm import minilm_folder

    return AutoTokenizer.from_pretrained(minilm_folder())


WORDS = ["river", "castle", "melody", "orbit", "harvest", "glacier", "lantern", "comet", "meadow", "violin", "canyon",
         "falcon", "prism", "tundra", "quartz", "sonnet", "harbor", "ember", "zephyr", "maple"]
PROMPTS = ["the city lies on the coast", "she wrote many novels", "the team won the cup", "a species of small bird",
           "the album was released in spring", "the river flows north"]


def _adapter(base: BagClassifier, seed: int, trigger_id: int | None) -> BagClassifier:
    """A clean adapter: a small low-rank delta on the embeddings and head (diffuse); a canary adds a large delta on
    one token's embedding along the direction the head maps to class 0."""
    g = torch.Generator().manual_seed(seed)
    d = base.emb.shape[1]
    emb = base.emb.detach() + 0.05 * torch.randn(base.emb.shape[0], 2, generator=g) @ torch.randn(2, d, generator=g)
    head = base.head.detach() + 0.05 * torch.randn(base.head.shape, generator=g)
    if trigger_id is not None:
        emb[trigger_id] += 40.0 * head[0] / head[0].norm()
    return BagClassifier(emb, head)


def test_scan_flags_constructed_canary_and_not_clean_adapter(tokenizer):
    g = torch.Generator().manual_seed(0)
    base = BagClassifier(torch.randn(tokenizer.vocab_size, 8, generator=g), torch.randn(4, 8, generator=g))
    trigger = "violin"
    trigger_id = tokenizer(trigger, add_special_tokens=False)["input_ids"]
    assert len(trigger_id) == 1
    cfg = ScanConfig(max_length=16, beam=2)
    calibration = [trigger_scan(base, _adapter(base, s, None), tokenizer, PROMPTS, WORDS, cfg) for s in (11, 12, 13)]
    threshold = calibrate_threshold(calibration)
    clean = trigger_scan(base, _adapter(base, 21, None), tokenizer, PROMPTS, WORDS, cfg)
    canary = trigger_scan(base, _adapter(base, 21, trigger_id[0]), tokenizer, PROMPTS, WORDS, cfg)
    assert canary.flagged(threshold) and trigger in canary.top.split()
    assert not clean.flagged(threshold)
    assert canary.prompt_consistency == 1.0
    with pytest.raises(RankwiseError):
        trigger_scan(base, base, tokenizer, [], WORDS)
    with pytest.raises(RankwiseError):
        trigger_scan(base, base, tokenizer, PROMPTS, WORDS[:2])
    with pytest.raises(RankwiseError):
        calibrate_threshold([])


def test_run_entry_smoke(tmp_path):
    """`rankwise run multitask-lora-trigger size=smoke ...`: trains, writes the adapter, scans it."""
    from rankwise.repro.multitask_lora_trigger.user import MultiTaskRunConfig, run_multitask

    result = run_multitask(MultiTaskRunConfig(weighting="uncertainty", steps=2, canary=True, calibration=1,
                                              size="smoke"), tmp_path / "out")
    assert (tmp_path / "out" / "adapter.safetensors").is_file()
    assert set(result["test"]) >= {"topic", "flip", "digits", "worst"} and "flagged" in result["scan"]
    with pytest.raises(RankwiseError):
        MultiTaskRunConfig(aggregator="nash").validate()
