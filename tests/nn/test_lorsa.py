"""Lorsa layer: the card's invariants (exact MHA embedding, top-K, causality, folding, z-pattern) and bad input."""

import pytest
import torch
from rounding import network_tol

from rankwise.errors import InvalidInputError, NumericalError, RankwiseError
from rankwise.nn.lorsa import CausalSelfAttention, Lorsa, LorsaConfig, Rope, lorsa_from_attention, lorsa_from_mha

pytestmark = pytest.mark.method("lorsa")
F64_TOL = 1e-12  # float64 with O(10)-sized values through a few sums: rounding is ~1e-15


def _lorsa(k=3, selection="abs", dtype=torch.float64, seed=0, rope=Rope(4, 1e4)):
    torch.manual_seed(seed)
    layer = Lorsa(LorsaConfig(d_model=12, n_qk=2, n_ov=8, d_qk=4, k=k, rope=rope, selection=selection)).to(dtype)
    with torch.no_grad():
        for b in (layer.b_Q, layer.b_K, layer.b_V, layer.b_O):
            b.normal_(std=0.1)
    return layer


def _x(b=2, t=7, d=12, seed=1, dtype=torch.float64):
    return torch.randn(b, t, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("n_kv, convention, bias", [(4, "half", False), (2, "half", True), (1, "adjacent", False)])
def test_reproduces_mha_exactly_without_sparsity(n_kv, convention, bias):
    torch.manual_seed(0)
    mha = CausalSelfAttention(16, 4, 6, n_kv_heads=n_kv, rope=Rope(4, 1e4, convention), bias=bias).double()
    lorsa = lorsa_from_mha(mha)
    assert lorsa.config.k == lorsa.config.n_ov == 24 and lorsa.config.group_size == 6
    x = _x(d=16, t=9)
    assert (lorsa(x) - mha(x)).abs().max() <= F64_TOL * mha(x).abs().max()


def test_sparsity_breaks_the_exact_embedding():  # the equality above is not vacuous
    torch.manual_seed(0)
    mha = CausalSelfAttention(16, 4, 6, rope=Rope(6)).double()
    lorsa = lorsa_from_mha(mha)
    x = _x(d=16)
    assert (lorsa(x, k=4) - mha(x)).abs().max() > 1e-3 * mha(x).abs().max()


def test_reproduces_hf_llama_attention():
    """Against transformers' own GQA attention (SmolLM2's layout and RoPE) in fp32: o_proj's output."""
    from rankwise.models import tiny_llama
    from rankwise.repro.lorsa.capture import capture_attention, exact_lorsa

    model = tiny_llama(seed=0, vocab_size=300, num_heads=4, num_kv_heads=2)
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    x, y = capture_attention(model, ids, layer=1)
    out = exact_lorsa(model, 1)(x)
    # fp32, one attention layer of width d: the rounding of O(1) terms (not of the ~0.07 outputs), network_tol's bound
    tol = network_tol(torch.float32, float(y.abs().max()), depth=1, width=model.config.hidden_size)
    assert (out - y).abs().max() <= tol


@pytest.mark.parametrize("selection", ["abs", "relu"])
def test_top_k_keeps_exactly_k_heads_with_the_largest_scores(selection):
    layer = _lorsa(k=3, selection=selection)
    x = _x()
    z = layer.activations(x)
    sparse = layer.sparse_activations(x)
    assert ((sparse != 0).sum(-1) == 3).all()
    kept = sparse != 0
    scores = layer.selection_scores(z)
    # every kept head scores at least as high as every dropped one, and keeps its dense value
    assert (scores.masked_fill(~kept, float("inf")).min(-1).values >= scores.masked_fill(kept, -1).max(-1).values).all()
    assert torch.equal(sparse[kept], z[kept])
    # the output is the sum of the kept heads' writes
    assert torch.allclose(layer(x), sparse @ layer.W_O + layer.b_O, atol=F64_TOL, rtol=0)


def test_ranking_uses_output_norms():
    layer = _lorsa(k=1)
    x = _x()
    z = layer.activations(x)
    with torch.no_grad():
        layer.W_O[5].mul_(1e6)  # head 5 now dominates every token where z != 0
    assert (layer.encode(x)[1][..., 0] == 5).all() and (z[..., 5] != 0).all()


def test_causal():
    layer = _lorsa()
    x = _x(t=10)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 4, 12, dtype=torch.float64)
    a, b = layer(x), layer(x2)
    assert (a[:, :6] - b[:, :6]).abs().max() <= F64_TOL
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3


def test_folding_output_norms_keeps_the_output():
    layer = _lorsa()
    x = _x()
    before = layer(x)
    layer.fold_output_norms_()
    assert torch.allclose(layer.W_O.norm(dim=-1), torch.ones(8, dtype=torch.float64))
    assert (layer(x) - before).abs().max() <= F64_TOL * before.abs().max()


def test_patterns_are_causal_distributions_and_z_pattern_sums_back():
    layer = _lorsa()
    x = _x()
    a = layer.patterns(x)
    assert a.shape == (2, 2, 7, 7)
    assert torch.allclose(a.sum(-1), torch.ones(2, 2, 7, dtype=torch.float64))
    assert (a.triu(1) == 0).all()
    z = layer.activations(x)
    for head in (0, 5):
        assert torch.allclose(layer.z_pattern(x, head).sum(-1), z[..., head], atol=F64_TOL, rtol=0)


def test_scales_map_raw_units():
    layer = _lorsa()
    x = _x()
    ref = layer(x)
    layer.input_scale.fill_(4.0)
    layer.output_scale.fill_(0.5)
    assert torch.allclose(layer(x / 4.0), ref / 0.5, atol=F64_TOL, rtol=0)


def test_b_k_without_rope_gets_no_gradient():  # the documented reason the conformance spec uses RoPE
    layer = _lorsa(rope=Rope(0))
    layer(_x()).pow(2).sum().backward()
    assert layer.b_K.grad.abs().max() <= 1e-10 and layer.b_Q.grad.abs().max() > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_ov=9), "multiple of n_qk"),
    (dict(k=9), "only n_ov = 8 heads"),
    (dict(k=0), "positive integer"),
    (dict(selection="signed"), "selection"),
    (dict(rope=Rope(6)), "exceeds the head dimension"),
    (dict(attn_scale=-1.0), "attn_scale"),
])
def test_bad_config(kwargs, message):
    base = dict(d_model=12, n_qk=2, n_ov=8, d_qk=4, k=3)
    with pytest.raises(InvalidInputError, match=message):
        LorsaConfig(**{**base, **kwargs})


def test_bad_rope():
    with pytest.raises(InvalidInputError, match="even"):
        Rope(3)
    with pytest.raises(InvalidInputError, match="convention"):
        Rope(4, convention="interleaved")


@pytest.mark.parametrize("x, error, message", [
    (torch.randn(2, 7, 11), InvalidInputError, r"\[batch, seq, 12\]"),
    (torch.randn(7, 12), InvalidInputError, r"\[batch, seq, 12\]"),
    (torch.randn(2, 0, 12), InvalidInputError, "empty"),
    (torch.full((1, 3, 12), float("nan")), NumericalError, "NaN or Inf"),
    (torch.ones(1, 3, 12, dtype=torch.long), InvalidInputError, "floating point"),
])
def test_bad_input(x, error, message):
    layer = _lorsa(dtype=torch.float32)
    with pytest.raises(error, match=message):
        layer(x)
    assert issubclass(error, RankwiseError)


def test_inf_input_is_refused():
    x = _x(dtype=torch.float32)
    x[0, 2, 3] = float("inf")
    with pytest.raises(NumericalError):
        _lorsa(dtype=torch.float32)(x)


def test_k_larger_than_heads_at_call_time():
    with pytest.raises(InvalidInputError, match=r"\[1, 8\]"):
        _lorsa()(_x(), k=9)


def test_from_attention_bad_shapes():
    w = torch.randn(24, 16)
    with pytest.raises(InvalidInputError, match="k/v weights"):
        lorsa_from_attention(w, torch.randn(12, 16), torch.randn(12, 16), torch.randn(16, 20), 4, 2)
    with pytest.raises(InvalidInputError, match="multiple"):
        lorsa_from_attention(w, w, w, torch.randn(16, 24), 4, 3)
