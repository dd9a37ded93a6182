"""LA-LoRA's reproduction tail (`repro.la_lora.features`): the cached prefix is what the top encoder layers see in a
full forward, the tail is those layers with the library's LoRA on their attention and a frozen given head, the tail
on the cache computes the full model with that LoRA, and the adapter-off pooled features are the frozen model's."""

import pytest
import torch
from torch import nn

from rankwise.adapters import AdaptedLinear, LoraAdapter
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_bert
from rankwise.models.minilm import mean_pool
from rankwise.repro.la_lora.features import (PooledHead, TopTail, accuracy, cache_inputs, check_tail, fit_public_head,
                                             head_logits, pooled_features, tail_logits)

pytestmark = pytest.mark.method("la-lora")

EPS32 = torch.finfo(torch.float32).eps
QV = ("attention.self.query", "attention.self.value")


def _batch(n=6, t=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (n, t), generator=gen)
    lengths = torch.randint(3, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    return ids * mask, mask


def _tail(model, top=2, head=None, **kw):
    head = head if head is not None else nn.Linear(model.config.hidden_size, 3)
    return TopTail(model.encoder.layer[-top:], head, 2, 4.0, QV, **kw)


def test_cached_inputs_are_what_the_first_tail_layer_sees_in_the_full_forward():
    model = tiny_bert(seed=0, num_layers=3)
    ids, mask = _batch()
    feats = cache_inputs(model, ids, mask, top=2, batch=4)
    seen = {}
    handle = model.encoder.layer[1].register_forward_pre_hook(lambda m, a: seen.update(h=a[0]))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    handle.remove()
    assert torch.equal(feats["h"], seen["h"]) and torch.equal(feats["mask"], mask.float())


def test_the_tail_trains_only_the_lora_factors_on_every_target_of_every_layer():
    model = tiny_bert(seed=0, num_layers=3)
    head = nn.Linear(32, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tail = _tail(model, head=head)
    trained = [n for n, p in tail.named_parameters() if p.requires_grad]
    assert sorted(tail.loras()) == [f"layers.{i}.{t}" for i in range(2) for t in QV]
    assert len(trained) == 8 and all(n.endswith((".A", ".B")) for n in trained)  # LA-LoRA's roles read the names
    for lora in tail.loras().values():
        assert isinstance(lora, LoraAdapter) and lora.scaling == 2.0 and not lora.B.any()
    assert torch.equal(tail.head.weight, head.weight) and not tail.head.weight.requires_grad
    assert tail.head.weight.data_ptr() != head.weight.data_ptr()  # a copy: training never touches the given head
    assert not any(isinstance(m, AdaptedLinear) for m in model.modules())  # the model itself is not adapted
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert {n for n, p in _tail(model, train_head=True).named_parameters() if p.requires_grad} >= {"head.weight", "head.bias"}


def test_the_tail_on_the_cache_is_the_full_model_with_its_lora():
    model = tiny_bert(seed=1, num_layers=3)
    ids, mask = _batch(seed=1)
    feats = {**cache_inputs(model, ids, mask, top=2), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}
    torch.manual_seed(0)
    tail = _tail(model)
    with torch.no_grad():
        plain = tail(feats["h"], feats["mask"])
        for lora in tail.loras().values():
            lora.B.normal_(std=0.5)  # a non-zero delta on every adapted projection
        logits = tail(feats["h"], feats["mask"])
    assert (logits - plain).abs().max() > 1e-3  # the LoRA path is exercised
    # eager attention in the tail, SDPA in the model: a few float32 roundings
    assert check_tail(model, tail, ids, mask, feats) <= 64 * EPS32
    assert accuracy(tail, tail_logits, feats, batch=4) == int((logits.argmax(-1) == feats["labels"]).sum()) / 6


def test_the_tail_is_vmap_safe_for_per_sample_gradients():
    from rankwise.core.privacy import per_sample_gradients
    from rankwise.training.federated import FederatedModel

    model = tiny_bert(seed=2, num_layers=3)
    ids, mask = _batch(n=4, seed=2)
    feats = {**cache_inputs(model, ids, mask, top=2), "labels": torch.tensor([0, 1, 2, 0])}
    fm = FederatedModel(_tail(model), tail_logits)
    with torch.no_grad():
        for lora in fm.module.loras().values():
            lora.B.normal_(std=0.5)
    grads, _ = per_sample_gradients(fm.sample_loss(), fm.tensors(), feats)
    name = "layers.0.attention.self.query.adapters.default.A"
    one = {k: v[1:2] for k, v in feats.items()}
    params = {n: p for n, p in fm.module.named_parameters() if n in fm.names}
    loss = nn.functional.cross_entropy(tail_logits(fm.module, one), one["labels"])
    (expected,) = torch.autograd.grad(loss, [params[name]])
    assert torch.allclose(grads[name][1], expected, atol=1e-6)


def test_pooled_features_are_the_frozen_models_and_need_the_adapter_off():
    model = tiny_bert(seed=3, num_layers=3)
    ids, mask = _batch(seed=3)
    tail = _tail(model)
    pooled = pooled_features(tail, cache_inputs(model, ids, mask, top=2), batch=4)
    with torch.no_grad():
        frozen = mean_pool(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
    assert pooled.shape == (6, 32) and torch.allclose(pooled, frozen, atol=1e-5)
    head = PooledHead(tail.head)
    assert torch.equal(head_logits(head, {"pooled": pooled}), tail.head(pooled))
    with torch.no_grad():
        next(iter(tail.loras().values())).B.fill_(0.1)
    with pytest.raises(InvalidInputError, match="B factors are zero"):
        pooled_features(tail, cache_inputs(model, ids, mask, top=2))


def test_the_public_head_is_deterministic_and_fits_separable_data():
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(30) % 3
    pooled = torch.randn(30, 8, generator=gen) * 0.1 + nn.functional.one_hot(labels, 8).float()
    a, b = fit_public_head(pooled, labels, 3, 1e-3), fit_public_head(pooled, labels, 3, 1e-3)
    assert torch.equal(a.weight, b.weight) and not a.weight.requires_grad
    assert bool((a(pooled).argmax(-1) == labels).all())
    with pytest.raises(InvalidInputError, match="public features"):
        fit_public_head(pooled, labels[:5], 3, 1e-3)
    with pytest.raises(InvalidInputError, match="weight_decay"):
        fit_public_head(pooled, labels, 3, -1.0)


def test_bad_tail_settings_are_refused():
    model = tiny_bert(seed=0, num_layers=2)
    ids, mask = _batch()
    with pytest.raises(InvalidInputError, match="between 1 and"):
        cache_inputs(model, ids, mask, top=3)
    with pytest.raises(InvalidInputError, match=r"\[N, T\]"):
        cache_inputs(model, ids, mask[:, :3], top=1)
    with pytest.raises(InvalidInputError, match="not an nn.Linear"):
        TopTail(model.encoder.layer[-1:], nn.Linear(32, 3), 2, 2.0, ("attention.output.LayerNorm",))
    with pytest.raises(InvalidInputError, match="at least one LoRA target"):
        TopTail(model.encoder.layer[-1:], nn.Linear(32, 3), 2, 2.0, ())
