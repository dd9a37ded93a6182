"""LA-LoRA's reproduction tail (`repro.la_lora.features`): the cached prefix is what the top FFN output projection
sees in a full forward, the tail's LoRA is the library's adapter drawn as the committed reports drew it, and the tail
on the cache computes the full model with that LoRA."""

import math

import pytest
import torch
from torch import nn

from rankwise.adapters import LoraAdapter
from rankwise.models import tiny_bert
from rankwise.repro.la_lora.features import TopTail, accuracy, cache_features, check_tail

pytestmark = pytest.mark.method("la-lora")

EPS32 = torch.finfo(torch.float32).eps


def _batch(n=6, t=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (n, t), generator=gen)
    lengths = torch.randint(3, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    return ids * mask, mask


def test_cached_features_are_the_projection_inputs_of_the_full_forward():
    model = tiny_bert(seed=0, num_layers=2)
    ids, mask = _batch()
    feats = cache_features(model, ids, mask, batch=4)
    out = model.encoder.layer[-1].output
    seen = {}
    handle = out.register_forward_pre_hook(lambda m, a: seen.update(x=a[0], residual=a[1]))
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    handle.remove()
    assert torch.equal(feats["x"], seen["x"]) and torch.equal(feats["attention_mask"], mask)
    assert torch.equal(out.LayerNorm(feats["z"]), hidden)  # z = W0 x + b + residual: BertOutput's own sum


def test_the_tail_lora_is_the_library_adapter_with_one_kaiming_draw():
    model = tiny_bert(seed=0, num_layers=2)
    norm = model.encoder.layer[-1].output.LayerNorm
    torch.manual_seed(5)
    tail = TopTail(norm, 2, 4.0, 128, 3)
    after = torch.get_rng_state()
    torch.manual_seed(5)  # the reference order: A (Kaiming-uniform, a=sqrt(5)), then the head
    a = nn.init.kaiming_uniform_(torch.empty(2, 128), a=math.sqrt(5))
    head = nn.Linear(32, 3)
    assert isinstance(tail.lora, LoraAdapter) and tail.lora.scaling == 2.0
    assert torch.equal(tail.lora.A, a) and torch.equal(tail.lora.B, torch.zeros(32, 2))
    assert torch.equal(tail.head.weight, head.weight) and torch.equal(tail.head.bias, head.bias)
    assert torch.equal(after, torch.get_rng_state())  # nothing else drew
    trained = [n for n, p in tail.named_parameters() if p.requires_grad]
    assert trained == ["lora.A", "lora.B", "head.weight", "head.bias"]  # LA-LoRA's roles read the names ...A / ...B


def test_the_tail_on_the_cache_is_the_full_model_with_its_lora():
    model = tiny_bert(seed=1, num_layers=2)
    ids, mask = _batch(seed=1)
    feats = {**cache_features(model, ids, mask), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}
    torch.manual_seed(0)
    tail = TopTail(model.encoder.layer[-1].output.LayerNorm, 2, 2.0, 128, 3)
    with torch.no_grad():
        tail.lora.B.normal_(std=0.5)  # a non-zero delta
    # the same sums in another grouping (z + delta vs (W0 x + b + delta) + residual): a few float32 roundings
    assert check_tail(model, tail, ids, mask, feats) <= 64 * EPS32
    with torch.no_grad():
        logits = tail(feats)
    assert accuracy(tail, feats, batch=4) == int((logits.argmax(-1) == feats["labels"]).sum()) / 6  # chunked, in order
