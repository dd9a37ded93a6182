"""The reproduction's operating points (regimes.py), its per-window NLL and the torchao parity counter."""

import math

import pytest
import torch
from rounding import logits_tol

from rankwise.errors import InvalidInputError
from rankwise.eval import perplexity
from rankwise.models import tiny_llama
from rankwise.quant.block import get_recipe
from rankwise.quant.fake_quant import quantize_linears_
from rankwise.repro.microscaling_ue5m3.model_eval import quantize_at_regime_, window_nlls
from rankwise.repro.microscaling_ue5m3.regimes import (REGIME_TARGETS_LOG2, block_amax, regime_alpha, regime_alphas,
                                                       scale_census)
from rankwise.repro.microscaling_ue5m3.weights import ue5m3_changed_blocks

pytestmark = pytest.mark.method("microscaling-ue5m3")


def _weights(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("a", torch.randn(24, 64, generator=g) * 0.02), ("b", torch.randn(16, 96, generator=g) * 3.0)]


@pytest.mark.parametrize("regime", sorted(REGIME_TARGETS_LOG2))
def test_regime_alpha_is_a_power_of_two_that_puts_the_median_scale_on_target(regime):
    for _, w in _weights():
        alpha = regime_alpha(w, REGIME_TARGETS_LOG2[regime])
        assert math.log2(alpha) == round(math.log2(alpha))
        median_log2 = math.log2(float(block_amax(w * alpha, 16).median()) / 6)
        assert abs(median_log2 - REGIME_TARGETS_LOG2[regime]) <= 0.5  # rounding j to an integer moves <= half an octave


def test_scale_census_counts_each_ue4m3_range():
    # four blocks of 8 whose ideal scale amax / 6 is normal, subnormal, below the flush threshold, above the maximum
    amax = torch.tensor([2.0**-3, 2.0**-8, 2.0**-11, 1000.0]) * 6
    w = torch.zeros(4, 8)
    w[:, 0] = amax
    c = scale_census([("w", w)], {"w": 1.0}, get_recipe("fp4-ue4m3", 8))
    assert c.blocks == 4
    assert (c.normal, c.subnormal, c.flushed, c.saturated) == (0.25, 0.25, 0.25, 0.25)
    c5 = scale_census([("w", w)], {"w": 1.0}, get_recipe("fp4-ue5m3", 8))  # UE5M3 covers all four as normal
    assert (c5.normal, c5.subnormal, c5.flushed, c5.saturated) == (1.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("regime", ["normal", "subnormal", "saturate"])
def test_ue5m3_is_unchanged_by_a_power_of_two_while_its_scales_stay_normal(regime):
    changed, compared = ue5m3_changed_blocks(_weights(), regime, 8)
    assert compared == (24 * 64 + 16 * 96) // 8 and changed == 0


def test_ue4m3_changes_at_the_subnormal_point():
    # the control for the invariance above: the format whose range is crossed does change
    w = _weights()[1][1]
    alpha = regime_alpha(w, REGIME_TARGETS_LOG2["subnormal"])
    from rankwise.quant.fake_quant import fake_quantize

    recipe = get_recipe("fp4-ue4m3", 8)
    assert not torch.equal(fake_quantize(w * alpha, recipe) / alpha, fake_quantize(w, recipe))


def test_bad_input_raises():
    with pytest.raises(InvalidInputError):
        regime_alphas(_weights(), "tiny")
    with pytest.raises(InvalidInputError):
        regime_alpha(torch.zeros(4, 32), -7.5)
    with pytest.raises(InvalidInputError):
        scale_census(_weights(), regime_alphas(_weights(), "as-is"), get_recipe("fp4-fp32", 8))


def test_window_nlls_average_to_the_perplexity():
    model = tiny_llama(0)
    windows = torch.randint(0, 1000, (5, 17), generator=torch.Generator().manual_seed(0))
    nlls = window_nlls(model, windows, batch_size=2)
    assert len(nlls) == 5
    # equal-length windows make the mean of means the overall mean. The two batchings (2 vs 4 windows) may round
    # the logits differently (each token's NLL moves by at most twice logits_tol), and perplexity() sums a batch's
    # up to 64 float32 token losses in float32 first (at most 64 u max NLL on the mean); the perplexity's relative
    # error is the mean NLL's absolute error
    with torch.no_grad():
        logits = model(windows).logits
    tol = 2 * logits_tol(model, logits) + 64 * 2.0**-24 * max(nlls)
    assert math.isclose(math.exp(sum(nlls) / 5), perplexity(model, windows).perplexity, rel_tol=tol)


def test_quantize_at_regime_with_a_global_scale_equals_plain_quantization():
    a, b = tiny_llama(0), tiny_llama(0)
    quantize_at_regime_(a, get_recipe("fp4-ue4m3-s", 8), "subnormal", ("lm_head",))
    quantize_linears_(b, get_recipe("fp4-ue4m3-s", 8))
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n


def test_torchao_parity_counter_finds_no_mismatch_and_counts_blocks():
    from rankwise.repro.microscaling_ue5m3 import parity

    if not parity.available():
        pytest.skip("torchao not installed")
    w = [("w", torch.randn(8, 64, generator=torch.Generator().manual_seed(1)) * 0.05)]  # scales around 2^-6
    out = parity.parity_mismatches(w, {"w": 1.0})
    assert out["nvfp4"] == (0, 32) and out["mxfp4"] == (0, 16)
    bad, n = out["ue4m3-normal-blocks"]
    assert bad == 0 and 0 < n < 32  # only blocks with a normal ideal scale are compared
