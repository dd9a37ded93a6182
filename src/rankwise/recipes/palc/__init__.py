"""PALC (preference alignment via logit calibration): a bottleneck from the frozen model's last hidden state to an
offset on every vocabulary logit, trained on preference pairs, with a run-time strength gamma (card palc.md).

    from rankwise.recipes.palc import LogitCalibrator, PalcConfig, cache_pairs, train_offsets, greedy_decode
    pairs = cache_pairs(model, tokenizer, [PreferencePair(prompt, chosen, rejected), ...])   # the model read once
    calibrator = LogitCalibrator(hidden_size, vocab_size, PalcConfig(bottleneck=64))
    train_offsets(calibrator, pairs, PalcTrainConfig(lr=1e-3))
    greedy_decode(model, [prompt_ids], 32, calibrator, scale=1.0)

Files: `calibrator.py` (the module and the static steering control), `features.py` (what the frozen model
computed, cached), `loss.py` (the preference loss), `train.py` (training and the held-out measures), `decode.py`
(calibrated logits and decoding on a live model)."""

from rankwise.recipes.palc.calibrator import LogitCalibrator, PalcConfig, SteeringOffset
from rankwise.recipes.palc.decode import calibrated_logits, greedy_decode, left_pad
from rankwise.recipes.palc.features import CachedPairs, CachedSequences, PreferencePair, cache_pairs, cache_sequences
from rankwise.recipes.palc.loss import preference_loss, sequence_logprobs, token_logprobs
from rankwise.recipes.palc.train import (PalcTrainConfig, caa_vector, drift_from_base, pair_margins,
                                         preference_accuracy, train_offsets)

__all__ = [
    "LogitCalibrator", "PalcConfig", "SteeringOffset", "calibrated_logits", "greedy_decode", "left_pad",
    "CachedPairs", "CachedSequences", "PreferencePair", "cache_pairs", "cache_sequences", "preference_loss",
    "sequence_logprobs", "token_logprobs", "PalcTrainConfig", "caa_vector", "drift_from_base", "pair_margins",
    "preference_accuracy", "train_offsets",
]
