"""Deployable MLA with a joint latent (MHA2MLA's and DeepSeek's form: one down-projection that K and V share):
exact at full rank, the weight-space optimum of [W_K_nope; W_V] at any rank, every decoding path, the cache and the
DeepSeek-V3 export."""

import pytest
import torch
from rounding import logits_tol
from transformers import DynamicCache

from rankwise.compress.mla_deploy import (MLAAttention, convert_to_deployable_mla, expected_cache_bytes_per_token,
                                          load_deepseek_v3, export_deepseek_v3, mla_layers, set_absorb)
from rankwise.compress.mla_deploy.checks import absorbed_vs_expanded, generation_mismatches
from rankwise.compress.mla_deploy.rope import concentrate_pairs, decouple_rope
from rankwise.compress.mla.calibration import kv_input_moments
from rankwise.errors import InvalidInputError
from rankwise.eval import measured_kv_bytes_per_token
from rankwise.models import tiny_llama

pytestmark = pytest.mark.method("care-mla")

VOCAB = 2000
CALIB = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(1))


def _ids(b=2, t=24, seed=3):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _convert(model, method="mha2mla", **kw):
    kw.setdefault("kv_rank", 12)
    kw.setdefault("rope_dims", 8)
    return convert_to_deployable_mla(model, calibration=CALIB, use_cache=False, method=method, **kw)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(0, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def joint(model):
    """One latent of width 2 x 12 = 24 per layer plus an 8-dim rope key: the split model's 32 numbers per token."""
    return _convert(model)


def test_joint_layers_share_one_latent(joint):
    for attn in mla_layers(joint):
        assert attn.joint and attn.k_rank == attn.v_rank == attn.latent_rank == 24
        assert attn.kv_a_proj.weight.shape[0] == 24 + 8
    assert joint.config.rankwise_mla_deploy["joint"] is True


def test_mqa_full_rank_all_pairs_is_exact():
    """One KV head, every pair kept, the joint latent at full rank (2 x kv_width = 32 <= D): the GQA logits."""
    model = tiny_llama(1, vocab_size=VOCAB, num_kv_heads=1)
    mla = _convert(model, kv_rank=16, rope_dims=16)
    ids = _ids()
    with torch.no_grad():
        reference = model(ids).logits
        torch.testing.assert_close(mla(ids).logits, reference, rtol=0, atol=logits_tol(model, reference))


def test_joint_latent_is_the_best_rank_2r_fit_of_k_and_v_together(model, joint):
    """Eckart-Young: the joint SVD's [W_K_nope; W_V] error is the stacked matrix's spectral tail, and no larger than
    that of separate rank-r SVDs (a block-diagonal rank-2r fit of the same stack). Compared in float64 with a
    relative slack for the factors' float32 storage (~1e-7 per entry, ~1e-6 after the products)."""
    split = _convert(model, method="svd")
    moments = kv_input_moments(model, CALIB, use_cache=False)
    pairs = joint.config.rankwise_mla_deploy["rope_pairs"]
    assert pairs == split.config.rankwise_mla_deploy["rope_pairs"]  # 'high' for both: the same K_nope to fit
    for layer, a_joint, a_split, moment in zip(model.model.layers, mla_layers(joint), mla_layers(split), moments):
        attn = layer.self_attn
        w_q, w_k = attn.q_proj.weight.detach().T.double(), attn.k_proj.weight.detach().T.double()
        conc = concentrate_pairs(w_k, moment.covariance(), 2, 16)
        k_nope = decouple_rope(w_q, w_k, conc, pairs, 4, 2, 16).k_nope.T  # [kv_width, D]
        stack = torch.cat([k_nope, attn.v_proj.weight.detach().double()])  # [2 kv_width, D]
        down = a_joint.kv_a_proj.weight.detach().double()[:24]
        fit = torch.cat([a_joint.k_up.weight.detach().double(), a_joint.v_up.weight.detach().double()]) @ down
        tail = float(torch.linalg.svdvals(stack)[24:].square().sum())
        err = float((stack - fit).square().sum())
        assert err == pytest.approx(tail, rel=1e-4, abs=1e-6 * float(stack.square().sum()))
        d_split = a_split.kv_a_proj.weight.detach().double()
        fit_split = torch.cat([a_split.k_up.weight.detach().double() @ d_split[:12],
                               a_split.v_up.weight.detach().double() @ d_split[12:24]])
        assert err <= float((stack - fit_split).square().sum()) * (1 + 1e-5)


def test_cache_holds_the_joint_latent_and_rope_key_at_the_split_models_size(model, joint):
    cache = DynamicCache(config=joint.config)
    with torch.no_grad():
        joint(input_ids=_ids(1, 10), cache=cache, use_cache=True)
    for layer in cache.layers:
        assert layer.keys.shape == (1, 1, 10, 24) and layer.values.shape == (1, 1, 10, 8)
    measured = measured_kv_bytes_per_token(joint)
    assert measured == expected_cache_bytes_per_token(joint) == measured_kv_bytes_per_token(_convert(model, method="svd"))


def test_every_decoding_path_agrees(joint):
    with torch.no_grad():
        reference = joint(_ids()).logits
    assert absorbed_vs_expanded(joint, _ids(), decode_steps=4) <= logits_tol(joint, reference)
    assert generation_mismatches(joint, _ids(1, 8), new_tokens=10) == 0  # fused absorbed steps vs no cache
    for attn in mla_layers(joint):
        attn.fused_inference = False
    try:
        assert generation_mismatches(joint, _ids(1, 8), new_tokens=6) == 0  # absorbed from the parameters
    finally:
        for attn in mla_layers(joint):
            attn.fused_inference = True
    set_absorb(joint, False)
    try:
        assert generation_mismatches(joint, _ids(1, 8), new_tokens=6) == 0  # expanded
    finally:
        set_absorb(joint, True)


def test_export_maps_the_joint_latent_as_it_is(tmp_path, model):
    adjusted = _convert(model, allocation="adjusted")  # unequal widths across layers: padded to the widest
    export_deepseek_v3(adjusted, tmp_path / "ds")
    exported = load_deepseek_v3(tmp_path / "ds")
    assert exported.config.kv_lora_rank == max(a.latent_rank for a in mla_layers(adjusted))
    ids = _ids(2, 40)
    with torch.no_grad():
        reference = adjusted(ids).logits
        torch.testing.assert_close(exported(ids).logits, reference, rtol=0, atol=logits_tol(adjusted, reference))


def test_a_joint_latent_needs_equal_ranks():
    with pytest.raises(InvalidInputError, match="joint latent"):
        MLAAttention(32, 4, 2, 8, 6, 8, torch.arange(4), 0, joint=True)
