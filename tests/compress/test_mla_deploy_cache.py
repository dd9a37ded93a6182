"""The in-place KV cache (`preallocated_cache`): the same logits as transformers' DynamicCache, for GQA and MLA."""

import pytest
import torch
from rounding import logits_tol
from transformers import DynamicCache

from rankwise.compress.mla_deploy import convert_to_deployable_mla, set_absorb
from rankwise.compress.mla_deploy.cache import PreallocatedLayer, preallocated_cache
from rankwise.compress.mla_deploy.checks import decode_tokens_per_second
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama

pytestmark = pytest.mark.method("care-mla")

VOCAB = 2000


def _decode(model, cache, ids, steps=5):
    """Logits of a prefill of ids [B, T] and `steps` greedy cached steps: [B, T + steps, V]."""
    out = model(input_ids=ids, cache=cache, use_cache=True)
    logits = [out.logits]
    token = out.logits[:, -1:].argmax(-1)
    for _ in range(steps):
        out = model(input_ids=token, cache=cache, use_cache=True)
        logits.append(out.logits)
        token = out.logits[:, -1:].argmax(-1)
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("kind", ["gqa", "mla-absorbed", "mla-expanded"])
@torch.no_grad()
def test_preallocated_cache_gives_the_dynamic_cache_logits(kind):
    model = tiny_llama(0, vocab_size=VOCAB).double()  # float64: the two caches hold the same numbers, compared tightly
    if kind != "gqa":
        calib = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(1))
        model = set_absorb(convert_to_deployable_mla(model, kv_rank=12, rope_dims=8, calibration=calib, use_cache=False),
                           kind == "mla-absorbed")
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    ref = _decode(model, DynamicCache(config=model.config), ids)
    cache = preallocated_cache(model.config, chunk=2)  # chunk 2 < steps: the buffers grow several times
    ours = _decode(model, cache, ids)
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    assert cache.get_seq_length() == 9 + 5
    torch.testing.assert_close(ours, ref, rtol=0, atol=logits_tol(model, ref))  # strided views may change kernel order


def test_layer_appends_in_place_and_adopts_replaced_tensors():
    layer = PreallocatedLayer(chunk=4)
    k, v = torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 7)
    keys, _ = layer.update(k, v)
    buffer = layer._key_buffer
    keys, values = layer.update(k[..., :1, :], v[..., :1, :])
    assert layer._key_buffer is buffer and keys.data_ptr() == buffer.data_ptr()  # no copy: written in place
    torch.testing.assert_close(keys, torch.cat([k, k[..., :1, :]], dim=-2))
    layer.keys, layer.values = keys[..., :2, :].clone(), values[..., :2, :].clone()  # what a crop does
    keys, _ = layer.update(k, v)
    torch.testing.assert_close(keys, torch.cat([k[..., :2, :], k], dim=-2))


def test_crop_then_append_stays_in_place():
    """A crop (a shorter view of our buffer, a new object) leaves the fast path but keeps the buffer."""
    layer = PreallocatedLayer(chunk=8)
    k, v = torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 7)
    layer.update(k, v)
    buffer = layer._key_buffer
    layer.crop(-1)
    keys, values = layer.update(k[..., :1, :] + 1, v[..., :1, :] + 1)
    assert layer._key_buffer is buffer and layer.get_seq_length() == 3
    assert torch.equal(keys, torch.cat([k[..., :2, :], k[..., :1, :] + 1], dim=-2))  # copies only: exact
    assert torch.equal(values, torch.cat([v[..., :2, :], v[..., :1, :] + 1], dim=-2))


def test_bad_chunk_and_cache_kind_are_refused():
    model = tiny_llama(0, vocab_size=VOCAB)
    with pytest.raises(InvalidInputError):
        preallocated_cache(model.config, chunk=0)
    with pytest.raises(InvalidInputError):
        decode_tokens_per_second(model, 4, 1, cache="static")


def test_synthetic_context_decodes_at_the_requested_length():
    model = tiny_llama(0, vocab_size=VOCAB)
    assert decode_tokens_per_second(model, 40, 2, batch=3, cache="preallocated", synthetic_context=True) > 0
