"""Evaluation: perplexity, KV-cache bytes, time and memory."""

from rankwise.eval.kv_cache import cache_tensor_bytes, config_kv_bytes_per_token, measured_kv_bytes_per_token
from rankwise.eval.measure import Measurement, measure
from rankwise.eval.perplexity import PerplexityResult, logits_of, perplexity

__all__ = [
    "PerplexityResult", "perplexity", "logits_of", "cache_tensor_bytes", "config_kv_bytes_per_token",
    "measured_kv_bytes_per_token", "Measurement", "measure",
]
