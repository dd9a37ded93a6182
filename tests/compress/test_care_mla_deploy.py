"""Deployable MLA: decoupled RoPE identities, latent-only cache, absorbed decoding, generation, DeepSeek-V3 export."""

import pytest
import torch
from rounding import logits_tol, max_abs, network_tol
from transformers import BertConfig, DynamicCache

from rankwise.compress.mla_deploy import (
    convert_to_deployable_mla,
    expected_cache_bytes_per_token,
    export_deepseek_v3,
    load_deepseek_v3,
    set_absorb,
    to_deepseek_v3,
)
from rankwise.compress.mla_deploy.checks import absorbed_vs_expanded, generation_mismatches
from rankwise.compress.mla_deploy.rope import concentrate_pairs, decouple_rope, rope_columns, select_pairs
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.eval import measured_kv_bytes_per_token
from rankwise.models import tiny_llama

pytestmark = pytest.mark.method("care-mla")

VOCAB = 2000  # a small vocabulary keeps the tiny models' embedding and lm_head cheap
CALIB = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(1))


def tiny(seed=0, **kw):
    return tiny_llama(seed, vocab_size=VOCAB, **kw)


@pytest.fixture(scope="module")
def model():
    return tiny(0)


@pytest.fixture(scope="module")
def mla(model):
    """r_K = r_V = 12, rope key 8: 32 numbers per token and layer, half of GQA's 2 x 32."""
    return _convert(model)


def _convert(model, **kw):
    kw.setdefault("kv_rank", 12)
    kw.setdefault("rope_dims", 8)
    return convert_to_deployable_mla(model, calibration=CALIB, use_cache=False, **kw)


def _ids(b=2, t=24, seed=3):
    return torch.randint(0, 2000, (b, t), generator=torch.Generator().manual_seed(seed))


def test_decoupled_rope_splits_unrotated_scores_exactly():
    """q_h . k_j (no rotation) == q_rope_h . k_rope + q_h . k_nope_j for every head, whatever pairs are kept."""
    gen = torch.Generator().manual_seed(0)
    d, nh, g, dh = 24, 4, 2, 8
    w_q, w_k = torch.randn(d, nh * dh, generator=gen, dtype=torch.float64), torch.randn(d, g * dh, generator=gen, dtype=torch.float64)
    x = torch.randn(50, d, generator=gen, dtype=torch.float64)
    conc = concentrate_pairs(w_k, x.T @ x / 50, g, dh)
    split = decouple_rope(w_q, w_k, conc, [0, 2], nh, g, dh)
    q, k = (x @ w_q).view(50, nh, dh), (x @ w_k).view(50, g, dh)
    q_rope, k_rope, k_nope = (x @ split.q_rope).view(50, nh, 4), x @ split.k_rope, (x @ split.k_nope).view(50, g, dh)
    # rounding scales with the terms' absolute values, not with the scores (which may cancel): |x||W_Q| . |x||W_K|
    abs_q, abs_k = (x.abs() @ w_q.abs()).view(50, nh, dh), (x.abs() @ w_k.abs()).view(50, g, dh)
    for h in range(nh):
        j = h // (nh // g)
        full = q[:, h] @ k[:, j].T
        parts = q_rope[:, h] @ k_rope.T + q[:, h] @ k_nope[:, j].T
        tol = network_tol(torch.float64, max_abs(abs_q[:, h] @ abs_k[:, j].T), depth=3, width=d + dh)  # split, x @ W, dot
        torch.testing.assert_close(parts, full, rtol=0, atol=tol)
    # the concentrated direction carries at least the mean head's share of every pair's energy (top eigenvalue >=
    # mean eigenvalue; eigh and the d-wide moment sums round at float64 eps times the energy)
    slack = network_tol(torch.float64, max_abs(conc.total_energy), depth=2, width=d)
    assert bool((conc.key_energy >= conc.total_energy / g - slack).all())


def test_mqa_full_rank_all_pairs_is_exact():
    """With one KV head, every pair kept and full rank (no damping), MLA reproduces the GQA logits."""
    model = tiny(1, num_kv_heads=1)
    mla = _convert(model, kv_rank=16, rope_dims=16, damping=0.0)
    ids = _ids()
    with torch.no_grad():
        reference = model(ids).logits
        torch.testing.assert_close(mla(ids).logits, reference, rtol=0, atol=logits_tol(model, reference))


def test_absorbed_and_expanded_decoding_agree(model):
    adjusted = _convert(model, allocation="adjusted")
    with torch.no_grad():
        reference = adjusted(_ids()).logits
    assert absorbed_vs_expanded(adjusted, _ids(), decode_steps=4) <= logits_tol(adjusted, reference)
    assert all(layer.self_attn.absorb for layer in adjusted.model.layers)


def test_cache_holds_only_latent_and_rope_key(model, mla):
    cache = DynamicCache(config=mla.config)
    with torch.no_grad():
        mla(input_ids=_ids(1, 10), cache=cache, use_cache=True)
    for layer, attn in zip(cache.layers, (l.self_attn for l in mla.model.layers)):
        assert layer.keys.shape == (1, 1, 10, attn.k_rank + attn.v_rank)
        assert layer.values.shape == (1, 1, 10, attn.rope_dims)
    measured = measured_kv_bytes_per_token(mla)
    assert measured == expected_cache_bytes_per_token(mla) == 2 * (12 + 12 + 8) * 4
    assert measured == 0.5 * measured_kv_bytes_per_token(model)  # 2 * 12 + 8 = 32 = half of 2 * kv_width (64)


def test_generate_matches_no_cache_greedy(mla):
    assert generation_mismatches(mla, _ids(1, 8), new_tokens=10) == 0
    set_absorb(mla, False)
    try:
        assert generation_mismatches(mla, _ids(1, 8), new_tokens=6) == 0
    finally:
        set_absorb(mla, True)


def test_rope_selections(model):
    assert select_pairs("high", 3, 8) == [0, 1, 2]
    assert select_pairs("uniform", 4, 8) == [0, 2, 4, 6]
    scores = [torch.tensor([1.0, 5.0, 2.0, 5.0]), torch.tensor([0.0, 1.0, 3.0, 1.0])]
    assert select_pairs("contribution", 2, 4, scores) == [1, 2]  # normalised votes: [.077, .55, .55, .55] -> ties to lowest
    assert rope_columns([1, 3], 8).tolist() == [1, 3, 5, 7]
    with pytest.raises(UnknownNameError):
        select_pairs("best", 2, 4, scores)
    with pytest.raises(InvalidInputError):
        select_pairs("contribution", 2, 4, None)
    for selection in ("uniform", "contribution", "sensitivity"):
        converted = _convert(model, rope_selection=selection)
        assert len(converted.config.rankwise_mla_deploy["rope_pairs"]) == 4


def test_export_to_stock_deepseek_v3(tmp_path, model, mla):
    adjusted = _convert(model, allocation="adjusted")  # unequal ranks: the export pads the joint latent
    export_deepseek_v3(adjusted, tmp_path / "ds")
    exported = load_deepseek_v3(tmp_path / "ds")
    assert type(exported).__name__ == "DeepseekV3ForCausalLM"
    ids = _ids(2, 40)
    with torch.no_grad():
        reference = adjusted(ids).logits
        torch.testing.assert_close(exported(ids).logits, reference, rtol=0, atol=logits_tol(adjusted, reference))
    kw = dict(max_new_tokens=6, do_sample=False)
    assert torch.equal(exported.generate(ids[:1, :8], **kw), adjusted.generate(ids[:1, :8], **kw))
    assert measured_kv_bytes_per_token(to_deepseek_v3(mla)) == measured_kv_bytes_per_token(mla)  # uniform ranks: no padding


def test_bad_input(model):
    with pytest.raises(InvalidInputError, match="rope_dims"):
        _convert(model, rope_dims=7)
    with pytest.raises(InvalidInputError, match="rope_dims"):
        _convert(model, rope_dims=32)  # wider than the head (16)
    with pytest.raises(InvalidInputError, match="kv_rank"):
        _convert(model, kv_rank=0)
    with pytest.raises(InvalidInputError, match="calibration"):
        convert_to_deployable_mla(model, kv_rank=12, rope_dims=8)
    with pytest.raises(UnknownNameError):
        _convert(model, rope_selection="lowest")
    with pytest.raises(InvalidInputError):
        from transformers import BertModel

        convert_to_deployable_mla(BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)), 4, 4, calibration=CALIB)
    with pytest.raises(InvalidInputError, match="MLA"):
        set_absorb(model, True)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive", "per-head"])
def test_single_head_decode_equals_broadcast_sdpa(mask_kind):
    from rankwise.compress.mla_deploy.attention import _single_head_decode

    gen = torch.Generator().manual_seed(0)
    b, h, s, scale = 2, 6, 17, 0.3
    q_lat, q_rope = torch.randn(b, h, 10, generator=gen), torch.randn(b, h, 4, generator=gen)
    latent, k_rope = torch.randn(b, s, 17, generator=gen), torch.randn(b, s, 4, generator=gen)
    c_k, c_v = latent.split([10, 7], dim=-1)  # views into the cache, as in the model
    keep = torch.rand(b, 1, s, generator=gen) > 0.3
    keep[..., -1] = True  # the token itself is always visible
    mask = {"none": None, "bool": keep, "additive": torch.zeros(b, 1, s).masked_fill(~keep, float("-inf")),
            "per-head": keep.expand(b, h, s)}[mask_kind]
    wide = [t.double() for t in (q_lat, q_rope, c_k, k_rope, c_v)]  # the reference: SDPA on one shared head, float64
    ref = torch.nn.functional.scaled_dot_product_attention(
        torch.cat(wide[:2], -1).unsqueeze(1), torch.cat(wide[2:4], -1).unsqueeze(1), wide[4].unsqueeze(1),
        attn_mask=None if mask is None else mask.unsqueeze(1), scale=scale).squeeze(1)  # heads = query rows
    # float32 rounding of the scores (relative to their terms' absolute sum) moves the softmax weights of values of
    # size |c_v|: the bound scales with both, over the score width (r_K + 2k) and the S-term weighted sum
    abs_scores = scale * (q_lat.abs() @ c_k.abs().transpose(1, 2) + q_rope.abs() @ k_rope.abs().transpose(1, 2))
    tol = network_tol(torch.float32, max_abs(c_v) * max(1.0, max_abs(abs_scores)), depth=2, width=10 + 4 + s)
    torch.testing.assert_close(_single_head_decode(q_lat, q_rope, c_k, k_rope, c_v, mask, scale).double(), ref, rtol=0, atol=tol)


def test_absorbed_decoding_with_left_padding_matches_expanded(mla):
    ids = _ids(2, 12)
    attention = torch.ones_like(ids)
    attention[1, :5] = 0  # the second prompt is left-padded
    runs = []
    for absorb in (True, False):
        set_absorb(mla, absorb)
        cache, mask = DynamicCache(config=mla.config), attention
        with torch.no_grad():
            out = mla(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            logits = [out.logits[:, -1]]
            for _ in range(3):
                token = logits[-1].argmax(-1, keepdim=True)
                mask = torch.cat([mask, torch.ones_like(token)], dim=1)
                logits.append(mla(input_ids=token, attention_mask=mask, cache=cache, use_cache=True).logits[:, -1])
        runs.append(torch.stack(logits))
    set_absorb(mla, True)
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=logits_tol(mla, runs[1]))
