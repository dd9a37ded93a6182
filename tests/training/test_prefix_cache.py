"""The frozen-prefix cache (`rankwise.training.prefix_cache`) and its encoder and decoder parts: the cached point is
exactly the input the first adapted module receives in a full forward, the forward stops there, and the tasks batch
the cache as the loop expects."""

import pytest
import torch
from torch import nn

from rankwise.core.padding import pad_batch
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_bert, tiny_llama
from rankwise.models.minilm import mean_pool
from rankwise.training.cached_classification import CachedClassificationTask, cache_encoder_inputs
from rankwise.training.encoder_top import EncoderTopClassifier
from rankwise.training.frozen_prefix import IGNORE_INDEX, FrozenPrefixRunner
from rankwise.training.prefix_cache import CachedExamples, Ragged, batches, eval_mode, module_inputs
from rankwise.training.top_layers_lm import CachedSequencesLM
from rounding import assert_rounding_close


def _calls(modules):
    """Forward hooks counting the calls of each module; returns (counts, handles)."""
    counts = [0] * len(modules)
    handles = []
    for i, m in enumerate(modules):
        def hook(_m, _a, _o, i=i):
            counts[i] += 1
        handles.append(m.register_forward_hook(hook))
    return counts, handles


def test_module_inputs_is_the_full_forward_input_and_stops_there():
    model = tiny_llama(seed=1, vocab_size=300, num_layers=3)
    ids = torch.randint(0, 300, (2, 6), generator=torch.Generator().manual_seed(0))
    layers = model.model.layers
    counts, handles = _calls(list(layers))
    got = module_inputs(layers[1], lambda: model(input_ids=ids))
    assert counts == [1, 0, 0]  # layer 0 ran; the cached layer and the ones above never did
    for h in handles:
        h.remove()
    with torch.no_grad():
        full = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.equal(got.first(), full[1])  # the same operations: bit for bit
    assert not layers[1]._forward_pre_hooks  # the hook is gone
    with pytest.raises(InvalidInputError):
        module_inputs(nn.Linear(2, 2), lambda: model(input_ids=ids))  # never called by this forward


def test_runner_prefix_is_the_input_of_layer_start():
    model = tiny_llama(seed=2, vocab_size=300, num_layers=3)
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, 300, (n,), generator=gen) for n in (5, 3, 8)]
    for start in range(3):
        hs = FrozenPrefixRunner(model, start).prefix(ids, batch_size=2)
        with torch.no_grad():
            for s, h in zip(ids, hs):
                full = model(input_ids=s[None], output_hidden_states=True).hidden_states[start][0]
                # padded batches of 2 against one unpadded sequence: other shapes, other summation orders
                assert_rounding_close(h, full, model)


def test_cached_examples_take_and_chunks():
    h = torch.arange(12.0).reshape(4, 3)
    ragged = Ragged([torch.ones(n) * n for n in (1, 3, 2, 4)], -1.0)
    cache = CachedExamples(h=h, seq=ragged)
    assert len(cache) == 4 and cache.h is h and cache.seq is ragged
    batch = cache.take(torch.tensor([2, 0]))
    assert torch.equal(batch["h"], h[[2, 0]])
    assert torch.equal(batch["seq"], torch.tensor([[2.0, 2.0], [1.0, -1.0]]))
    parts = list(cache.chunks(3))
    assert [p["h"].size(0) for p in parts] == [3, 1] and torch.equal(torch.cat([p["h"] for p in parts]), h)
    assert torch.equal(parts[1]["seq"], torch.full((1, 4), 4.0))
    assert [(s.start, s.stop) for s in batches(5, 2)] == [(0, 2), (2, 4), (4, 6)]
    with pytest.raises(InvalidInputError):
        CachedExamples(h=h, labels=torch.zeros(3))  # 4 examples against 3
    with pytest.raises(AttributeError):
        cache.mask
    with pytest.raises(InvalidInputError):
        list(batches(3, 0))


def _tokenizer(texts, truncation, max_length, padding, return_tensors):
    """A stand-in for MiniLM's tokenizer: [CLS] word ids [SEP], right-padded to max_length."""
    ids = torch.zeros(len(texts), max_length, dtype=torch.long)
    mask = torch.zeros(len(texts), max_length, dtype=torch.long)
    for i, t in enumerate(texts):
        toks = [101] + [1000 + sum(map(ord, w)) % 5000 for w in t.split()][: max_length - 2] + [102]
        ids[i, : len(toks)], mask[i, : len(toks)] = torch.tensor(toks), 1
    return {"input_ids": ids, "attention_mask": mask}


TEXTS = ["the moon", "gardens in spring need water and light", "stars", "a b c d e f g h i j k l", "rain"]


def test_encoder_cache_is_the_layer_input_and_the_top_reproduces_the_full_model():
    model = tiny_bert(seed=0, num_layers=3)
    enc = _tokenizer(TEXTS, True, 10, "max_length", "pt")
    with torch.no_grad():
        full = model(**enc, output_hidden_states=True)
    for start in range(3):
        cached = cache_encoder_inputs(model, _tokenizer, TEXTS, [0, 1, 2, 1, 0], 10, start, batch_size=2)
        # The same operations on batches of 2 instead of 5: equal up to the network's float32 rounding (a matmul's
        # blocking may depend on the batch shape and the thread count).
        assert_rounding_close(cached.h, full.hidden_states[start], model)
        assert torch.equal(cached.mask, enc["attention_mask"].float()) and cached.labels.tolist() == [0, 1, 2, 1, 0]
        clf = EncoderTopClassifier(model.encoder.layer[start:], 32, 3)
        with torch.no_grad():
            expected = clf.head(mean_pool(full.last_hidden_state, enc["attention_mask"]))
            assert_rounding_close(clf(cached.h, cached.mask), expected, model)
    with pytest.raises(InvalidInputError):
        cache_encoder_inputs(model, _tokenizer, TEXTS, [0] * 5, max_length=10, start=3)


def test_classification_task_batches_the_cache_and_evaluates_in_eval_mode():
    model = tiny_bert(seed=1, num_layers=2)
    labels = [0, 1, 2, 1, 0]
    train = cache_encoder_inputs(model, _tokenizer, TEXTS, labels, max_length=8, start=1)
    task = CachedClassificationTask(train, train, eval_batch_size=2)
    assert task.num_train == 5 and task.train is train
    batch = task.batch(torch.tensor([4, 1]))
    assert list(batch) == ["h", "mask", "labels"] and torch.equal(batch["h"], train.h[[4, 1]])
    clf = EncoderTopClassifier(model.encoder.layer[1:], 32, 3).train()
    modes = []
    clf.register_forward_pre_hook(lambda m, a: modes.append(m.training))
    metrics = task.evaluate(clf)
    assert modes and not any(modes) and clf.training  # scored in eval mode, the mode restored
    with torch.no_grad(), eval_mode(clf):
        whole = clf(train.h, train.mask)
    assert_rounding_close(task.logits(clf, train), whole, model)
    assert metrics["accuracy"] == float((whole.argmax(-1) == train.labels).float().mean())


def test_cached_sequences_task_pads_per_batch_and_takes_the_runner_loss():
    model = tiny_llama(seed=3, vocab_size=200, num_layers=2)
    runner = FrozenPrefixRunner(model, start=1)
    gen = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, 200, (n,), generator=gen) for n in (4, 7, 5)]
    targets = []
    for s in ids:
        t = torch.full_like(s, IGNORE_INDEX)
        t[1:-1] = s[2:]  # no loss at the first position (a prompt token) nor the last
        targets.append(t)
    hs = runner.prefix(ids)
    task = CachedSequencesLM(runner, hs, targets)
    idx = torch.tensor([1, 0])
    batch = task.batch(idx)
    assert task.num_train == 3 and task.evaluate(model) == {}
    assert torch.equal(batch["h"], pad_batch([hs[1], hs[0]], 0.0))
    assert torch.equal(batch["targets"], pad_batch([targets[1], targets[0]], IGNORE_INDEX))
    assert torch.equal(task.loss(model, batch), runner.loss(batch["h"], batch["targets"]))
    with pytest.raises(InvalidInputError):
        CachedSequencesLM(runner, hs, targets[:2])
    with pytest.raises(InvalidInputError):
        CachedSequencesLM(runner, hs, [t[:-1] for t in targets])
