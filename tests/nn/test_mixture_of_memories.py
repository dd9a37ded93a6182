"""Mixture-of-Memories: the card's invariants (one memory = the base layer, recurrent = chunked, routed-subsequence
states, routing weights, causality, aux loss), gradients, and bad input."""

import pytest
import torch
from rounding import max_abs, network_tol

from rankwise.errors import InvalidInputError, NumericalError, RankwiseError
from rankwise.nn.mixture_of_memories import (
    CausalSoftmaxAttention, LinearAttention, MixtureOfMemories, linear_attention_chunked, linear_attention_recurrent,
    load_balancing_loss,
)

pytestmark = pytest.mark.method("mixture-of-memories")

EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps


def _x(batch=2, seq=19, d=16, dtype=torch.float64, seed=0):
    return torch.randn(batch, seq, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _mom(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(num_heads=2, num_memories=4, top_k=2, shared_memory=True, decay="retnet", chunk_size=5)
    cfg.update(kw)
    return MixtureOfMemories(16, **cfg)


# --- the update rule ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 4, 7, None])
@pytest.mark.parametrize("decayed", [False, True])
def test_chunked_kernel_equals_recurrent_kernel(chunk, decayed):
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 3, 23, 5, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 23, 4, generator=g, dtype=torch.float64)
    s0 = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    a = -torch.rand(2, 3, 23, generator=g, dtype=torch.float64) if decayed else None
    o_ref, s_ref = linear_attention_recurrent(q, k, v, a, s0)
    o, s = linear_attention_chunked(q, k, v, a, chunk, s0)
    # sums of ~23 products of O(1) numbers in float64: a few hundred ulps of the output's scale
    tol = 256 * EPS64 * float(o_ref.abs().max())
    assert (o - o_ref).abs().max() <= tol and (s - s_ref).abs().max() <= 256 * EPS64 * float(s_ref.abs().max())


def test_kernel_matches_explicit_sum():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 6, 3, generator=g, dtype=torch.float64) for _ in range(3))
    a = -torch.rand(1, 1, 6, generator=g, dtype=torch.float64)
    o, _ = linear_attention_chunked(q, k, v, a, 4)
    t = 5  # o_t = sum_{s <= t} exp(sum_{s < r <= t} a_r) (q_t . k_s) v_s
    expect = sum(torch.exp(a[0, 0, s + 1:t + 1].sum()) * (q[0, 0, t] @ k[0, 0, s]) * v[0, 0, s] for s in range(t + 1))
    # two orders of a 6 x 3-term sum: a few roundings of the sum of the terms' magnitudes
    size = sum(torch.exp(a[0, 0, s + 1:t + 1].sum()) * (q[0, 0, t].abs() @ k[0, 0, s].abs()) * v[0, 0, s].abs()
               for s in range(t + 1))
    torch.testing.assert_close(o[0, 0, t], expect, rtol=0, atol=64 * EPS64 * float(size.max()))


# --- the layer: one memory, the two forms, routed subsequences -----------------------------------------------------

@pytest.mark.parametrize("decay", [None, "retnet"])
def test_one_memory_equals_base_layer(decay):
    torch.manual_seed(3)
    base = LinearAttention(16, 2, decay=decay, chunk_size=5).double()
    mom = MixtureOfMemories(16, 2, num_memories=1, top_k=1, shared_memory=False, decay=decay, chunk_size=5).double()
    missing, unexpected = mom.load_state_dict(base.state_dict(), strict=False)
    assert missing == ["router.gate.weight"] and unexpected == []
    x = _x()
    # one memory, top-1: the routing weight is exactly 1 and every token writes, so the arithmetic is the base's
    assert torch.equal(mom(x), base(x))
    assert torch.equal(mom(x, mode="recurrent"), base(x, mode="recurrent"))


def test_a_different_memory_count_is_not_the_base_layer():
    # the equality above can fail: with two memories (routed, top-1) the output differs from the base layer's
    torch.manual_seed(3)
    base = LinearAttention(16, 2, chunk_size=5).double()
    mom = MixtureOfMemories(16, 2, num_memories=2, top_k=1, shared_memory=False, chunk_size=5).double()
    mom.kv.k.linear.weight.data[:16] = base.kv.k.linear.weight.data
    assert not torch.allclose(mom(_x()), base(_x()))


@pytest.mark.parametrize("kw", [
    dict(), dict(decay=None), dict(shared_memory=False), dict(top_k=1), dict(num_memories=3, top_k=3),
    dict(chunk_size=None), dict(chunk_size=1), dict(conv_size=0),
])
def test_recurrent_equals_chunked_float64(kw):
    layer = _mom(**kw).double()
    x = _x()
    y = layer(x).detach()
    # float64 rounding over ~19 steps of O(1) sums, amplified by the RMSNorm of small read-outs: 1e6 ulps is 2e-10
    torch.testing.assert_close(layer(x, mode="recurrent"), y, rtol=0, atol=1e6 * EPS64 * float(y.abs().max()))


@pytest.mark.parametrize("layer_cls", [MixtureOfMemories, LinearAttention])
def test_recurrent_equals_chunked_float32(layer_cls):
    torch.manual_seed(4)
    layer = layer_cls(16, 2, decay="retnet", chunk_size=8)
    x = _x(seq=40, dtype=torch.float32)
    y = layer(x).detach()
    # the two forms differ in the order of 40 serial state updates of width 16: network_tol over seq x d_model
    tol = network_tol(torch.float32, max_abs(y), depth=x.shape[1], width=x.shape[2])
    torch.testing.assert_close(layer(x, mode="recurrent"), y, rtol=0, atol=tol)


def test_memory_state_equals_its_routed_subsequence():
    layer = _mom(seed=5).double()
    x = _x(seed=5)
    state = layer.init_state(x.shape[0], x)
    for t in range(x.shape[1]):
        _, state = layer.step(x[:, t], state)
    routing = layer.router(x)
    q = layer.q(x)
    k, v = layer.kv(x)
    H = layer.num_heads
    for m in range(layer.num_memories):
        for b in range(x.shape[0]):
            idx = routing.routed[b, :, m].nonzero().flatten()
            assert 0 < idx.numel() < x.shape[1]  # the check means something only with skipped tokens
            hs = slice(m * H, (m + 1) * H)
            # the update alone on the routed tokens: their keys and values and one decay step each
            a = layer.log_gamma[None, :, None].expand(1, H, idx.numel())
            _, s_sub = linear_attention_recurrent(q[b:b + 1, :, idx], k[b:b + 1, hs][:, :, idx],
                                                  v[b:b + 1, hs][:, :, idx], a)
            # the same idx.numel() rank-1 updates in another order of the decays: float64 rounding of S's size
            tol = network_tol(torch.float64, max_abs(s_sub), depth=idx.numel(), width=k.shape[-1])
            torch.testing.assert_close(state["S"][b:b + 1, hs], s_sub, rtol=0, atol=tol)


def test_routing_weights_sum_to_one_over_the_top_k():
    layer = _mom(seed=6).double()
    r = layer.router(_x())
    assert (r.routed.sum(-1) == layer.top_k).all()
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(r.weights.shape[:-1], dtype=torch.float64))
    assert (r.weights[~r.routed] == 0).all() and (r.weights[r.routed] > 0).all()


@pytest.mark.parametrize("layer_factory", [
    lambda: _mom(seed=7), lambda: _mom(seed=7, chunk_size=None), lambda: LinearAttention(16, 2, chunk_size=4),
    lambda: CausalSoftmaxAttention(16, 2),
])
def test_causality(layer_factory):
    layer = layer_factory().double()
    x = _x(seq=17)
    t0 = 9
    x2 = x.clone()
    x2[:, t0:] += 10 * torch.randn_like(x2[:, t0:])
    with torch.no_grad():
        y, y2 = layer(x), layer(x2)
    torch.testing.assert_close(y2[:, :t0], y[:, :t0], rtol=0, atol=16 * EPS64 * float(y.abs().max()))
    assert not torch.allclose(y2[:, t0:], y[:, t0:])  # the perturbation does reach the future


def test_every_parameter_gets_a_gradient():
    layer = _mom(seed=8)
    y, routing = layer(_x(dtype=torch.float32), return_routing=True)
    (y.pow(2).mean() + 0.01 * load_balancing_loss(routing.logits, layer.top_k)).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0 and torch.isfinite(p.grad).all(), name


def test_top1_router_learns_from_the_aux_loss_only():
    layer = _mom(seed=9, top_k=1)
    y, routing = layer(_x(dtype=torch.float32), return_routing=True)
    y.pow(2).mean().backward(retain_graph=True)
    assert layer.router.gate.weight.grad is None or not layer.router.gate.weight.grad.any()
    load_balancing_loss(routing.logits, 1).backward()
    assert layer.router.gate.weight.grad.abs().sum() > 0


# --- the load-balancing loss ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_aux_loss_is_k_for_uniform_routing(k):
    M = 4
    base = torch.tensor([0.3, 0.1, -0.2, -0.5], dtype=torch.float64)
    # the M cyclic shifts of one logit vector: each memory is each token's j-th choice once, and P_e = 1/M exactly
    logits = torch.stack([base.roll(i) for i in range(M)]).repeat(5, 1)
    torch.testing.assert_close(load_balancing_loss(logits, k), torch.tensor(float(k), dtype=torch.float64))
    collapsed = torch.zeros(20, M, dtype=torch.float64)
    collapsed[:, 0] = 8.0
    assert load_balancing_loss(collapsed, k) > k + 0.5


def test_aux_loss_concatenates_layers():
    g = torch.Generator().manual_seed(10)
    a, b = torch.randn(2, 5, 4, generator=g), torch.randn(3, 4, generator=g)
    torch.testing.assert_close(load_balancing_loss([a, b], 2), load_balancing_loss(torch.cat([a.reshape(-1, 4), b]), 2))


# --- the softmax baseline ------------------------------------------------------------------------------------------

def test_softmax_attention_matches_explicit_softmax():
    torch.manual_seed(11)
    layer = CausalSoftmaxAttention(16, 2).double()
    x = _x(seq=7)
    q, k, v = layer.q(x), layer.k(x), layer.v(x)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    ref = layer.readout(s.softmax(-1) @ v)
    torch.testing.assert_close(layer(x), ref, rtol=0, atol=network_tol(torch.float64, max_abs(ref), 1, 16))


# --- bad input -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: MixtureOfMemories(16, 2, num_memories=2, top_k=3),
    lambda: MixtureOfMemories(16, 2, num_memories=0),
    lambda: MixtureOfMemories(16, 2, top_k=0),
    lambda: LinearAttention(16, 2, decay=1.5),
    lambda: LinearAttention(16, 2, decay=[0.9]),
    lambda: LinearAttention(16, 2, chunk_size=0),
    lambda: LinearAttention(16, 2, conv_size=-1),
    lambda: CausalSoftmaxAttention(16, 0),
])
def test_bad_configuration(make):
    with pytest.raises(InvalidInputError):
        make()


@pytest.mark.parametrize("layer_factory", [lambda: _mom(), lambda: LinearAttention(16, 2), lambda: CausalSoftmaxAttention(16)])
@pytest.mark.parametrize("x, error, match", [
    (torch.randn(2, 5, 15), InvalidInputError, "d_model=16"),
    (torch.randn(5, 16), InvalidInputError, "batch, seq"),
    (torch.randn(2, 0, 16), InvalidInputError, "empty"),
    (torch.randn(0, 3, 16), InvalidInputError, "empty"),
    (torch.ones(2, 3, 16, dtype=torch.int64), InvalidInputError, "floating"),
    (torch.tensor([[[float("nan")] * 16]]), NumericalError, "NaN"),
    (torch.tensor([[[float("inf")] * 16]]), NumericalError, "NaN or Inf"),
    ([[0.0] * 16], InvalidInputError, "torch.Tensor"),
])
def test_bad_input(layer_factory, x, error, match):
    with pytest.raises(error, match=match) as info:
        layer_factory()(x)
    assert isinstance(info.value, RankwiseError)


def test_bad_mode_and_aux_arguments():
    with pytest.raises(InvalidInputError, match="mode"):
        _mom()(_x(dtype=torch.float32), mode="parallel")
    with pytest.raises(InvalidInputError, match="at least one layer"):
        load_balancing_loss([], 2)
    with pytest.raises(InvalidInputError, match="top_k"):
        load_balancing_loss(torch.randn(3, 4), 5)
    with pytest.raises(InvalidInputError, match="same number"):
        load_balancing_loss([torch.randn(3, 4), torch.randn(3, 5)], 2)
