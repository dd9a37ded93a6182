"""The small MoE byte LM (rankwise.models.moe) and its cached pretraining (rankwise.models.moe_pretrain): layout,
causality, routing, sparse dispatch against a dense float64 reference, byte windows, and the smoke recipe's
determinism, learning and cache round trip."""

from __future__ import annotations

import math

import pytest
import torch
from rounding import network_tol
from torch import nn
from torch.nn import functional as F

from rankwise.core.threads import limit_threads
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.eval.perplexity import perplexity
from rankwise.models import moe_pretrain
from rankwise.models.moe import MoEConfig, SparseMoE, TinyMoELM, byte_encode, byte_windows, rope

pytestmark = pytest.mark.method("codequant")

SMALL = MoEConfig(hidden_size=32, num_layers=2, num_heads=4, num_experts=4, top_k=2, expert_hidden_size=48, init_std=0.1)


@pytest.fixture(autouse=True)
def _one_thread():
    with limit_threads(1):
        yield


def _model(config: MoEConfig = SMALL, seed: int = 0, dtype: torch.dtype = torch.float64) -> TinyMoELM:
    torch.manual_seed(seed)
    return TinyMoELM(config).to(dtype).eval()


def test_layout_follows_qwen3_moe_names_and_shapes():
    model = TinyMoELM()
    c = model.moe_config
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_experts, c.top_k, c.expert_hidden_size,
            c.max_seq_len) == (256, 128, 2, 4, 8, 2, 256, 256)
    assert not hasattr(model, "config")  # else perplexity.logits_of would call it as a transformers model
    assert model.model.embed_tokens.weight.shape == (256, 128) and model.lm_head.weight.shape == (256, 128)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # untied
    assert isinstance(model.model.norm, nn.RMSNorm) and len(model.model.layers) == 2
    for layer in model.model.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            assert isinstance(norm, nn.RMSNorm) and norm.eps == 1e-5 and norm.weight.shape == (128,)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            proj = getattr(layer.self_attn, name)
            assert isinstance(proj, nn.Linear) and proj.bias is None and proj.weight.shape == (128, 128)
        mlp = layer.mlp
        assert isinstance(mlp, SparseMoE) and mlp.top_k == 2 and len(mlp.experts) == 8
        assert mlp.gate.weight.shape == (8, 128) and mlp.gate.bias is None  # [out, in]: its outputs are router logits
        for expert in mlp.experts:
            assert expert.gate_proj.weight.shape == expert.up_proj.weight.shape == (256, 128)
            assert expert.down_proj.weight.shape == (128, 256)
            assert all(p.bias is None for p in (expert.gate_proj, expert.up_proj, expert.down_proj))
    ids = torch.randint(0, 256, (3, 17))
    with torch.no_grad():
        assert model(ids).shape == (3, 17, 256) and model(ids).dtype == torch.float32
    assert float(perplexity(model, ids, batch_size=2).mean_nll) > 0  # the project's perplexity reads it as a plain LM


def test_forward_refuses_bad_input_and_config():
    model = _model(dtype=torch.float32)
    for bad in (torch.zeros(2, 4), torch.zeros(4, dtype=torch.int64), torch.full((1, 3), 256), torch.full((1, 3), -1),
                torch.zeros(0, 3, dtype=torch.int64)):
        with pytest.raises(InvalidInputError):
            model(bad)
    with pytest.raises(InvalidInputError, match="heads"):
        MoEConfig(hidden_size=30, num_heads=4)
    with pytest.raises(InvalidInputError, match="top_k"):
        MoEConfig(num_experts=2, top_k=3)
    with pytest.raises(InvalidInputError, match="run the model"):
        TinyMoELM(SMALL).aux_loss()


def test_future_tokens_do_not_change_earlier_logits():
    model = _model()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 15] = (ids[:, 15] + 1) % 256
    with torch.no_grad():
        a, b = model(ids), model(changed)
    tol = network_tol(torch.float64, float(a.abs().max()), SMALL.num_layers, SMALL.expert_hidden_size)
    torch.testing.assert_close(a[:, :15], b[:, :15], rtol=0, atol=tol)
    assert float((a[:, 15:] - b[:, 15:]).abs().max()) > 1e3 * tol  # the change is seen from its position on


def test_rope_depends_only_on_relative_position():
    q, k = torch.randn(1, 1, 40, 8, dtype=torch.float64), torch.randn(1, 1, 40, 8, dtype=torch.float64)
    same_q, same_k = q[:, :, :1].expand_as(q), k[:, :, :1].expand_as(k)  # one vector at every position
    scores = rope(same_q, 1e4) @ rope(same_k, 1e4).transpose(-1, -2)  # [40, 40]: depends on m - n only
    torch.testing.assert_close(scores[0, 0, 10, 3], scores[0, 0, 30, 23], rtol=0, atol=1e-12)
    torch.testing.assert_close(rope(q, 1e4)[..., 0, :], q[..., 0, :], rtol=0, atol=0)  # position 0 is not rotated
    assert not torch.allclose(scores[0, 0, 10, 3], scores[0, 0, 10, 4])


def test_routing_weights_sum_to_one_over_k_distinct_experts():
    moe = _model().model.layers[0].mlp
    x = torch.randn(500, SMALL.hidden_size, dtype=torch.float64)
    weights, indices, probs = moe.route(x)
    assert weights.shape == indices.shape == (500, 2) and probs.shape == (500, 4)
    torch.testing.assert_close(weights.sum(-1), torch.ones(500, dtype=torch.float64), rtol=0, atol=4 * 2**-52)
    assert bool((indices[:, 0] != indices[:, 1]).all())  # exactly k different experts per token
    chosen = probs.gather(1, indices)
    assert bool((chosen.min(1).values >= probs.masked_fill(torch.zeros_like(probs, dtype=torch.bool).scatter(
        1, indices, True), -1).max(1).values).all())  # they are the k most probable
    torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True), rtol=0, atol=4 * 2**-52)
    moe(x.unsqueeze(0))
    assert int(moe.last_counts.sum()) == 500 * 2
    assert torch.equal(moe.last_counts, torch.bincount(indices.reshape(-1), minlength=4))


def test_sparse_dispatch_equals_the_dense_masked_computation():
    moe = _model().model.layers[1].mlp
    x = torch.randn(3, 50, SMALL.hidden_size, dtype=torch.float64)
    flat = x.reshape(-1, SMALL.hidden_size)
    with torch.no_grad():
        out = moe(x)
        probs = torch.softmax(flat @ moe.gate.weight.T, dim=-1)
        top, idx = probs.topk(2, dim=-1)
        dense_w = torch.zeros_like(probs).scatter(1, idx, top / top.sum(-1, keepdim=True))  # [N, E], zero off the top-k
        every = torch.stack([(F.silu(flat @ e.gate_proj.weight.T) * (flat @ e.up_proj.weight.T)) @ e.down_proj.weight.T
                             for e in moe.experts], dim=1)  # [N, E, d]: every expert on every token, written out
        expected = (dense_w.unsqueeze(-1) * every).sum(1).view_as(x)
    assert bool((dense_w > 0).sum(1).eq(2).all())
    tol = network_tol(torch.float64, float(expected.abs().max()), 2, SMALL.expert_hidden_size)
    torch.testing.assert_close(out, expected, rtol=0, atol=tol)
    share = torch.bincount(idx.reshape(-1), minlength=4).double() / idx.numel()
    aux = 4 * (share * probs.mean(0)).sum()  # Switch: E * sum_e f_e p_e
    torch.testing.assert_close(moe.last_aux_loss, aux, rtol=0, atol=1e-14)
    torch.testing.assert_close(_aux_of_uniform(), torch.tensor(1.0, dtype=torch.float64), rtol=0, atol=1e-15)


def _aux_of_uniform() -> torch.Tensor:
    """A router with zero weights: every probability 1/E, ties broken to the same top-k; f sums to 1 -> loss 1."""
    moe = _model().model.layers[0].mlp
    with torch.no_grad():
        moe.gate.weight.zero_()
        moe(torch.randn(1, 8, SMALL.hidden_size, dtype=torch.float64))
    return moe.last_aux_loss


def test_byte_windows_cut_the_separated_stream():
    assert byte_encode("é a").tolist() == [0xC3, 0xA9, 32, 97]
    w = byte_windows(["abc", "dé"], 3)  # stream a b c 0 d C3 A9 0: two windows, tail dropped
    assert w.dtype == torch.int64 and w.tolist() == [[97, 98, 99], [0, 100, 0xC3]]
    assert byte_windows(["abcdefgh"] * 5, 4, max_windows=3).shape == (3, 4)
    for texts, seq_len, match in ((["abc"], 1, "seq_len"), (["abc"], True, "seq_len"), ([], 4, "no texts"),
                                  (["abc", ""], 2, "empty"), ("abcdef", 2, "sequence"), (["a\x00b"], 2, "NUL"),
                                  (["ab"], 8, "fewer than one window")):
        with pytest.raises(InvalidInputError, match=match):
            byte_windows(texts, seq_len)
    with pytest.raises(InvalidInputError, match="max_windows"):
        byte_windows(["abcdef"], 2, max_windows=0)


def _equal_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_smoke_pretraining_is_deterministic_and_learns():
    first = moe_pretrain.pretrained_moe("smoke", use_cache=False)
    second = moe_pretrain.pretrained_moe("smoke", use_cache=False)
    assert _equal_weights(first.module, second.module) and not first.from_cache and not first.module.training
    recipe = first.recipe
    assert len(first.history) == recipe.steps
    # initial logits are ~0 (std-0.02 weights): the first loss is ln 256 + 0.01 x (aux ~ 1)
    assert first.history[0]["loss"] == pytest.approx(math.log(256) + recipe.aux_coef, abs=0.1)
    assert first.held_out_loss < math.log(256) - 1.0  # it learned the byte distribution at least
    assert first.held_out_perplexity == pytest.approx(math.exp(first.held_out_loss))
    assert 0 < first.unigram_loss < math.log(256)
    for row in first.expert_share:
        assert len(row) == recipe.model.num_experts and sum(row) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(UnknownNameError, match="tiny-moe-wiki"):
        moe_pretrain.pretrained_moe("mixtral")


def test_cache_round_trip_and_a_corrupt_entry_retrains(tmp_cache):
    first = moe_pretrain.pretrained_moe("smoke")
    second = moe_pretrain.pretrained_moe("smoke")
    assert not first.from_cache and second.from_cache and not second.module.training
    assert _equal_weights(first.module, second.module)
    assert (second.held_out_loss, second.unigram_loss, second.expert_share, second.pretrain_seconds) == \
        (first.held_out_loss, first.unigram_loss, first.expert_share, first.pretrain_seconds)
    windows = byte_windows(["a held-out check of the loaded module, long enough for a window"], 16)
    with torch.no_grad():
        assert torch.equal(first.module(windows), second.module(windows))
    (entry,) = (tmp_cache / moe_pretrain.CACHE_NAMESPACE).iterdir()
    blob = entry / "weights.safetensors"
    raw = bytearray(blob.read_bytes())
    raw[-4] ^= 0xFF
    blob.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        again = moe_pretrain.pretrained_moe("smoke")
    assert not again.from_cache and _equal_weights(first.module, again.module)
    assert moe_pretrain.pretrained_moe("smoke").from_cache
