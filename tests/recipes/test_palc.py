"""PALC (card palc.md): the card's invariants on a tiny Llama, the cached features against the live model, decoding
with left padding, training, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from rankwise.errors import InvalidInputError
from rankwise.models.tiny import tiny_llama
from rankwise.recipes.palc import (LogitCalibrator, PalcConfig, PalcTrainConfig, PreferencePair, SteeringOffset,
                                   caa_vector, cache_pairs, cache_sequences, calibrated_logits, drift_from_base,
                                   greedy_decode, pair_margins, preference_accuracy, preference_loss,
                                   sequence_logprobs, token_logprobs, train_offsets)

pytestmark = pytest.mark.method("palc")
VOCAB, HIDDEN = 96, 64


class CharTokenizer:
    """One token per character (codes mod VOCAB, 0 is padding)."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + ord(c) % (VOCAB - 1) for c in text]}


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, vocab_size=VOCAB, hidden_size=HIDDEN)


PAIRS = [PreferencePair(f"Q{i}:", " yes" + "s" * (i % 3), " no" + "o" * (i % 2)) for i in range(12)]


def test_scale_zero_is_the_base_model_exactly(model):
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    cal = LogitCalibrator(HIDDEN, VOCAB, PalcConfig(bottleneck=8), seed=0)
    base = model(input_ids=ids).logits
    assert torch.equal(calibrated_logits(model, cal, ids, scale=0.0), base)
    assert not torch.equal(calibrated_logits(model, cal, ids, scale=1.0), base)
    prompts = [[5, 6, 7], [8, 9]]
    assert greedy_decode(model, prompts, 5, cal, scale=0.0) == greedy_decode(model, prompts, 5)


def test_no_gradient_reaches_the_base(model):
    cal = LogitCalibrator(HIDDEN, VOCAB, PalcConfig(bottleneck=8), seed=0)
    model.zero_grad(set_to_none=True)
    calibrated_logits(model, cal, torch.tensor([[3, 4, 5]])).logsumexp(-1).sum().backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None for p in cal.parameters())


def test_position_wise_and_parameter_count():
    B = 8
    cal = LogitCalibrator(HIDDEN, VOCAB, PalcConfig(bottleneck=B, dropout=0.0), seed=1).eval()
    h = torch.randn(7, HIDDEN)
    perm = torch.randperm(7)
    torch.testing.assert_close(cal(h[perm]), cal(h)[perm], rtol=0, atol=0)
    assert cal.parameter_count() == B * (HIDDEN + VOCAB)


def test_effective_dimension_equals_the_dense_reference():
    cal = LogitCalibrator(HIDDEN, VOCAB, PalcConfig(bottleneck=8), seed=2)
    sigma = torch.linalg.svdvals(cal.up.weight.detach().double() @ cal.down.weight.detach().double())
    assert cal.effective_dimension() == pytest.approx(float(sigma.sum() ** 2 / (sigma ** 2).sum()), rel=1e-9)
    assert 1.0 <= cal.effective_dimension() <= 8.0


def test_cached_features_equal_the_live_model_and_hold_response_positions_only(model):
    tok = CharTokenizer()
    items = [("ab", "cde"), ("fghij", "k")]
    seqs = cache_sequences(model, tok, items, batch_size=2, logits_dtype=torch.float32)
    assert seqs.ends.tolist() == [3, 4] and seqs.labels.tolist() == tok("cde")["input_ids"] + tok("k")["input_ids"]
    for (prompt, response), start in zip(items, seqs.starts.tolist()):
        ids = torch.tensor([tok(prompt + response)["input_ids"]])
        live = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
        # batched with right padding vs alone: float32 rounding of the same sums in another order, a few dozen ulps
        # of the logits' magnitude through two layers (hidden 64)
        tol = 64 * torch.finfo(torch.float32).eps * float(live.abs().max())
        torch.testing.assert_close(seqs.base_logits[start:start + len(response)], live, rtol=0, atol=tol)
    # a different prompt changes which hidden states are cached, never which rows the loss sees
    other = cache_sequences(model, tok, [("zz", "cde"), ("y", "k")], logits_dtype=torch.float32)
    assert torch.equal(other.labels, seqs.labels) and torch.equal(other.ends, seqs.ends)


def test_loss_identities():
    x = torch.tensor([-1.2, 0.3], dtype=torch.float64)  # float64: log 2 to its rounding
    assert float(preference_loss(x, x)) == pytest.approx(math.log(2), rel=1e-12)
    per_token = torch.tensor([-1.0, -3.0, -2.0])
    segment = torch.tensor([0, 0, 1])
    assert sequence_logprobs(per_token, segment, 2).tolist() == [-2.0, -2.0]
    assert sequence_logprobs(per_token, segment, 2, mean=False).tolist() == [-4.0, -2.0]


def test_zero_up_projection_gives_the_base_preference_loss(model):
    pairs = cache_pairs(model, CharTokenizer(), PAIRS, logits_dtype=torch.float32)
    cal = LogitCalibrator(HIDDEN, VOCAB, PalcConfig(bottleneck=4), seed=0)
    with torch.no_grad():
        cal.up.weight.zero_()
    torch.testing.assert_close(pair_margins(cal, pairs), pair_margins(None, pairs), rtol=0, atol=0)
    seqs = pairs.sequences
    lp = token_logprobs(seqs.base_logits, None, seqs.labels)
    assert lp.max() <= 0


def test_training_learns_a_preference_and_is_deterministic(model):
    pairs = cache_pairs(model, CharTokenizer(), PAIRS, logits_dtype=torch.float32)
    config = PalcTrainConfig(lr=3e-2, epochs=15, batch_pairs=4, seed=3)

    def fit():
        cal = LogitCalibrator(HIDDEN, VOCAB, PalcConfig(bottleneck=8), seed=0)
        return cal, train_offsets(cal, pairs, config)

    cal, losses = fit()
    _, again = fit()
    assert losses == again
    assert sum(losses[-3:]) / 3 < 0.5 * math.log(2)
    assert preference_accuracy(cal, pairs) == 1.0
    drift = drift_from_base(cal, pairs.sequences, scale=1.0)
    assert drift["kl"] > 0 and drift_from_base(cal, pairs.sequences, scale=0.0)["kl"] == pytest.approx(0.0, abs=1e-6)


def test_steering_offset_is_constant_over_positions(model):
    pairs = cache_pairs(model, CharTokenizer(), PAIRS, logits_dtype=torch.float32)
    v = caa_vector(pairs)
    steer = SteeringOffset(model.get_output_embeddings().weight, v)
    out = steer(torch.randn(5, HIDDEN))
    torch.testing.assert_close(out, (model.get_output_embeddings().weight @ v).expand(5, VOCAB))
    assert train_offsets(steer, pairs, PalcTrainConfig(lr=1e-2, epochs=1))


def test_batched_decoding_with_left_padding_equals_one_by_one(model):
    cal = LogitCalibrator(HIDDEN, VOCAB, PalcConfig(bottleneck=8), seed=4)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12]]
    batched = greedy_decode(model, prompts, 6, cal, scale=2.0)
    assert batched == [greedy_decode(model, [p], 6, cal, scale=2.0)[0] for p in prompts]


def test_bad_input(model):
    with pytest.raises(InvalidInputError, match="bottleneck"):
        PalcConfig(bottleneck=0)
    with pytest.raises(InvalidInputError, match="dropout"):
        PalcConfig(dropout=1.0)
    with pytest.raises(InvalidInputError, match="lr"):
        PalcTrainConfig(lr=0.0)
    with pytest.raises(InvalidInputError, match="no preference pairs"):
        cache_pairs(model, CharTokenizer(), [])
    with pytest.raises(InvalidInputError, match="at least one token"):
        cache_sequences(model, CharTokenizer(), [("", "abc")])
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        greedy_decode(model, [[1]], 0)
    encoder = torch.nn.Linear(2, 2)
    encoder.get_output_embeddings = lambda: None
    with pytest.raises(InvalidInputError, match="no output layer"):
        cache_sequences(encoder, CharTokenizer(), [("a", "b")])
