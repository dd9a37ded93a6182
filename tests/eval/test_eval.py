import math

import pytest
import torch

from rankwise.errors import InvalidInputError
from rankwise.eval import config_kv_bytes_per_token, measure, measured_kv_bytes_per_token, perplexity
from rankwise.models import tiny_llama
from rounding import logits_tol


def test_perplexity_equals_a_hand_computation():
    model = tiny_llama(seed=3)
    windows = torch.randint(0, 49152, (3, 9), generator=torch.Generator().manual_seed(0))
    total, count, single = 0.0, 0, []
    with torch.no_grad():
        for w in windows:
            single.append(model(w[None]).logits[0])
            logits = single[-1].double()
            for t in range(len(w) - 1):
                log_probs = logits[t] - torch.logsumexp(logits[t], dim=0)
                total -= float(log_probs[w[t + 1]])
                count += 1
    result = perplexity(model, windows, batch_size=2)
    assert result.tokens == count == 3 * 8
    # Batched vs one-window forwards differ by the network's rounding (a token's NLL moves by <= 2 max|d logits|),
    # and perplexity() takes each batch's NLL sum (<= 16 terms of ~11) in float32; exp turns that into a relative
    # error. A wrong shift or mask moves the NLL by O(1).
    mean = total / count
    tol = 2 * logits_tol(model, torch.stack(single)) + 16 * torch.finfo(torch.float32).eps * mean
    assert result.mean_nll == pytest.approx(mean, rel=0, abs=tol)
    assert result.perplexity == pytest.approx(math.exp(mean), rel=tol)
    assert perplexity(model, windows, batch_size=3).mean_nll == pytest.approx(result.mean_nll, rel=0, abs=tol)


def test_perplexity_rejects_bad_windows():
    model = tiny_llama()
    with pytest.raises(InvalidInputError):
        perplexity(model, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(InvalidInputError):
        perplexity(model, torch.zeros(5, dtype=torch.long))


def test_measured_kv_bytes_match_the_config_for_standard_attention():
    model = tiny_llama(num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2)
    expected = 2 * 3 * 2 * 16 * 4
    assert config_kv_bytes_per_token(model.config) == expected
    assert measured_kv_bytes_per_token(model) == expected


def test_measure_returns_result_and_positive_time():
    result, m = measure(lambda n: torch.ones(n).sum().item(), 1000)
    assert result == 1000 and m.wall_s > 0 and m.peak_rss_delta_bytes >= 0


@pytest.mark.real_model
def test_smollm2_perplexity_is_in_the_expected_range(smollm2):
    from rankwise.data import token_windows

    model, tok = smollm2
    result = perplexity(model, token_windows(tok, "eval", 512, max_windows=4))
    assert 10 < result.perplexity < 30
    assert measured_kv_bytes_per_token(model) == 2 * 30 * 3 * 64 * 4
