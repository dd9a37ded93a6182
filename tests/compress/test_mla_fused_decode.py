"""Fused absorbed decoding (`MLAAttention._fused_decode`): the same logits as the parameter path and the expanded
path, fused weights that never go stale, and training that still reaches the real parameters."""

import copy

import pytest
import torch
from rounding import logits_tol, max_abs, network_tol
from transformers import DynamicCache

from rankwise.compress.mla_deploy import convert_to_deployable_mla, mla_layers, set_absorb
from rankwise.compress.mla_deploy.cache import preallocated_cache
from rankwise.models import tiny_llama

pytestmark = pytest.mark.method("care-mla")

VOCAB = 2000
CALIB = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(1))
PARAMETERS = ("q_proj", "q_rope_proj", "kv_a_proj", "k_up", "v_up", "o_proj")


def _mla(seed=0):
    """Two layers, 4 query heads in 2 KV groups (head dim 16), r_K = r_V = 12, an 8-dim rope key."""
    model = tiny_llama(seed, vocab_size=VOCAB)
    return convert_to_deployable_mla(model, kv_rank=12, rope_dims=8, calibration=CALIB, use_cache=False)


@pytest.fixture(scope="module")
def mla():
    return _mla()


def _ids(b, t, seed=3):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _set_mode(model, mode):
    """mode: 'fused' (the default inference path), 'parameters' (absorbed, from the parameters) or 'expanded'."""
    set_absorb(model, mode != "expanded")
    for attn in mla_layers(model):
        attn.fused_inference = mode == "fused"


@torch.no_grad()
def _decode(model, ids, steps=4, cache="dynamic", attention_mask=None):
    """Logits of a prefill of ids [B, T] and `steps` greedy single-token steps: [B, T + steps, V]."""
    kv = DynamicCache(config=model.config) if cache == "dynamic" else preallocated_cache(model.config, chunk=2)
    mask = attention_mask
    out = model(input_ids=ids, attention_mask=mask, cache=kv, use_cache=True)
    logits = [out.logits]
    for _ in range(steps):
        token = logits[-1][:, -1:].argmax(-1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        logits.append(model(input_ids=token, attention_mask=mask, cache=kv, use_cache=True).logits)
    return torch.cat(logits, dim=1)


def _modes(model, ids, **kw):
    runs = {}
    for mode in ("fused", "parameters", "expanded"):
        _set_mode(model, mode)
        runs[mode] = _decode(model, ids, **kw)
    _set_mode(model, "fused")
    return runs


def _assert_modes_agree(model, runs):
    for mode in ("parameters", "expanded"):
        torch.testing.assert_close(runs["fused"], runs[mode], rtol=0, atol=logits_tol(model, runs[mode]))


@pytest.mark.parametrize("batch, cache", [(1, "dynamic"), (1, "preallocated"), (3, "dynamic"), (3, "preallocated")])
def test_fused_decode_equals_parameter_and_expanded_paths(mla, batch, cache):
    runs = _modes(mla, _ids(batch, 9), cache=cache)
    _assert_modes_agree(mla, runs)
    assert all(attn._fused is not None for attn in mla_layers(mla))  # the fused step did run


def test_fused_decode_with_left_padding(mla):
    ids = _ids(2, 12)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # the second prompt is left-padded: a bool mask reaches the decoding steps
    _assert_modes_agree(mla, _modes(mla, ids, attention_mask=mask))


def test_fused_decode_in_float64():
    """In float64 the three paths agree to float64 rounding: the fused step computes the same function."""
    model = _mla().double()
    runs = _modes(model, _ids(2, 7))
    _assert_modes_agree(model, runs)
    assert all(attn._fused.input_t.dtype == torch.float64 for attn in mla_layers(model))  # rebuilt after .double()


def test_single_token_forward_without_cache(mla):
    """q_len 1 with no cache at all (a one-token prompt, use_cache=False) takes the fused step too."""
    ids = _ids(3, 1)
    with torch.no_grad():
        fused = mla(input_ids=ids, use_cache=False).logits
        _set_mode(mla, "expanded")
        expanded = mla(input_ids=ids, use_cache=False).logits
    _set_mode(mla, "fused")
    torch.testing.assert_close(fused, expanded, rtol=0, atol=logits_tol(mla, expanded))


def _fused_vs_parameters(model, ids):
    """(fused logits, parameter-path logits) of one decode run each; the model is left in fused mode."""
    runs = {}
    for mode in ("fused", "parameters"):
        _set_mode(model, mode)
        runs[mode] = _decode(model, ids, steps=2)
    _set_mode(model, "fused")
    return runs["fused"], runs["parameters"]


def _assert_fresh(model, ids, before):
    """Fused decoding matches the parameters as they are now, and no longer the logits of `before`."""
    fused, reference = _fused_vs_parameters(model, ids)
    tol = logits_tol(model, reference)
    # the premise: the parameters moved the logits well beyond the tolerance, so stale copies would fail below
    assert max_abs(reference - before) > 10 * tol
    torch.testing.assert_close(fused, reference, rtol=0, atol=tol)


def _train_step(model, ids, optimizer):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("options", [{}, {"foreach": True}, {"fused": True}])
def test_fused_weights_follow_an_optimizer_step(options):
    model, ids = _mla(), _ids(1, 6)
    before, _ = _fused_vs_parameters(model, ids)
    _train_step(model, _ids(2, 8, seed=5), torch.optim.AdamW(model.parameters(), lr=1e-2, **options))
    _assert_fresh(model, ids, before)


def test_fused_weights_follow_a_fused_optimizer_step_without_a_forward():
    """AdamW(fused=True) writes without bumping `_version`; with gradients set by hand (as zeroth-order methods do)
    no grad-enabled forward drops the copies either: the optimizer-step count must catch it."""
    model, ids = _mla(), _ids(1, 6)
    before, _ = _fused_vs_parameters(model, ids)
    params = [p for attn in mla_layers(model) for p in attn.parameters()]
    versions = [p._version for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    torch.optim.AdamW(params, lr=1e-2, fused=True).step()
    assert [p._version for p in params] == versions  # the premise: the version counters did not move
    _assert_fresh(model, ids, before)


def test_fused_weights_follow_load_state_dict():
    model, ids = _mla(0), _ids(1, 6)
    before, _ = _fused_vs_parameters(model, ids)
    model.load_state_dict(_mla(seed=1).state_dict())
    _assert_fresh(model, ids, before)


def test_fused_weights_follow_in_place_edits_and_replaced_parameters():
    model, ids = _mla(), _ids(1, 6)
    attn = mla_layers(model)[0]
    before, _ = _fused_vs_parameters(model, ids)
    with torch.no_grad():
        attn.q_rope_proj.weight.mul_(3.0)  # an in-place write: bumps _version
    _assert_fresh(model, ids, before)
    before, _ = _fused_vs_parameters(model, ids)
    attn.k_up.weight = torch.nn.Parameter(attn.k_up.weight.detach() * 3.0)  # a new Parameter: a new data_ptr
    _assert_fresh(model, ids, before)
    before, _ = _fused_vs_parameters(model, ids)
    attn.o_proj.weight.data = attn.o_proj.weight.detach() * 3.0  # replaced data: a new data_ptr
    _assert_fresh(model, ids, before)
    before, _ = _fused_vs_parameters(model, ids)
    attn.v_up.weight.data.mul_(3.0)  # through .data: undetectable by design, so drop the copies by hand
    attn.drop_fused_weights()
    _assert_fresh(model, ids, before)


def test_deepcopy_and_inference_mode_keep_fused_weights_consistent(mla):
    ids = _ids(1, 6)
    with torch.inference_mode():
        reference = _decode(mla, ids)  # fused weights built inside inference mode ...
    torch.testing.assert_close(_decode(mla, ids), reference, rtol=0, atol=logits_tol(mla, reference))  # ... used outside
    twin = copy.deepcopy(mla)
    with torch.no_grad():
        for attn in mla_layers(twin):
            attn.kv_a_proj.weight.mul_(0.5)  # editing the copy must not touch the original, nor reuse its fused weights
    torch.testing.assert_close(_decode(mla, ids), reference, rtol=0, atol=logits_tol(mla, reference))
    twin_fused, twin_parameters = _fused_vs_parameters(twin, ids)
    torch.testing.assert_close(twin_fused, twin_parameters, rtol=0, atol=logits_tol(twin, twin_parameters))


def test_state_dict_is_unchanged_by_fused_decoding(mla):
    keys = {k: (v.shape, v.dtype) for k, v in mla.state_dict().items()}
    _decode(mla, _ids(1, 5))
    assert {k: (v.shape, v.dtype) for k, v in mla.state_dict().items()} == keys


@pytest.mark.parametrize("q_len", [1, 6])
def test_grad_enabled_forward_trains_the_real_parameters(q_len):
    """With grad enabled (training), decoding steps and full sequences run from the parameters: every MLA
    parameter gets the gradient the expanded path gives it, and no fused copy survives the forward."""
    model = _mla()
    _decode(model, _ids(1, 4))  # builds fused copies first: training must not use them
    prompt, tail = _ids(2, 5), _ids(2, q_len, seed=7)
    grads = {}
    for mode in ("fused", "expanded"):  # 'fused' is the default mode: with grad on it must mean the parameters
        _set_mode(model, mode)
        model.zero_grad()
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=prompt, cache=cache, use_cache=True)
        model(input_ids=tail, cache=cache, use_cache=True).logits.square().mean().backward()
        assert all(attn._fused is None for attn in mla_layers(model))
        grads[mode] = {n: p.grad.clone() for attn in mla_layers(model) for n, p in attn.named_parameters(prefix=str(attn.layer_idx))}
    _set_mode(model, "fused")
    config = model.config
    for name, expected in grads["expanded"].items():
        assert max_abs(expected) > 0, name
        tol = network_tol(torch.float32, max_abs(expected), config.num_hidden_layers, config.hidden_size)
        torch.testing.assert_close(grads["fused"][name], expected, rtol=0, atol=tol, msg=name)
    assert {n.split(".")[1] for n in grads["expanded"]} == set(PARAMETERS)  # every MLA parameter trained
