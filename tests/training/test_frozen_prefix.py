"""Frozen-prefix execution (`rankwise.training.frozen_prefix`): running only the top layers on cached prefix states
computes what the full model computes, and the model is left as it was."""

import pytest
import torch

from rankwise.core.padding import pad_batch
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rankwise.training.frozen_prefix import IGNORE_INDEX, FrozenPrefixRunner
from rounding import assert_rounding_close


def test_prefix_then_top_equals_the_full_forward():
    model = tiny_llama(seed=1, vocab_size=500, num_layers=3)
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 500, (n,), generator=gen) for n in (7, 4, 9)]
    runner = FrozenPrefixRunner(model, start=2)
    hs = runner.prefix(ids, batch_size=2)
    assert [h.shape for h in hs] == [(7, 64), (4, 64), (9, 64)] and len(model.model.layers) == 3
    targets = []
    for s in ids:
        t = torch.full_like(s, IGNORE_INDEX)
        t[:-1] = s[1:]
        targets.append(t)
    per_seq = runner.per_sequence_logits(hs, targets)
    with torch.no_grad():
        for s, t, logits in zip(ids, targets, per_seq):
            full = model(input_ids=s[None]).logits[0]
            # padded batches of 2 against one unpadded sequence: other shapes, other summation orders
            assert_rounding_close(logits, full[t != IGNORE_INDEX], model)
        loss = runner.loss(pad_batch(hs, 0.0), pad_batch(targets, IGNORE_INDEX))
    assert torch.isfinite(loss)
    with pytest.raises(InvalidInputError):
        FrozenPrefixRunner(model, start=3)
