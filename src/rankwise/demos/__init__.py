"""Headlines for `rankwise demo`: one module per method that has landed, each with `headline(ctx: DemoContext)`.

A headline prints a few lines that show the method's main result on the embedded SmolLM2, in at most ~30 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class DemoContext:
    model: PreTrainedModel  # SmolLM2-135M-Instruct, fp32, eval mode; a headline must not modify it in place
    tokenizer: PreTrainedTokenizerBase
    eval_windows: torch.Tensor  # [W, T] held-out token windows, shared so every headline measures the same text
    baseline_ppl: float  # the unmodified model's perplexity on eval_windows
    calibration_windows: torch.Tensor  # [W, T] calibration-split windows, disjoint from eval_windows
    extras: dict = field(default_factory=dict)
