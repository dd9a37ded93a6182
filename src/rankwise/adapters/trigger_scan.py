"""Trigger scan for a downloaded adapter (defender side; card multitask-lora-trigger.md, "What a defender should
measure", items 1-2): search short insertions (rare tokens, and n-grams grown from the strongest ones) for those
that maximise the *adapter-induced* change of the output distribution, and report how concentrated that effect is.

For a text x, the adapter-induced shift is KL(p_adapted(x) || p_base(x)) (the output distribution of the adapted
model against the base model's on the same input). For an insertion c and prompts x_1..x_P, the effect is

    e[c, p] = shift(insert(x_p, c)) - shift(x_p),        score(c) = mean_p e[c, p]

Ordinary fine-tuning moves the output on every input about alike, so inserting one rare word or another changes the
shift by similar, small amounts: the scores of the candidates form a diffuse cloud. A trigger-conditioned adapter
moves it sharply for one insertion only. The flag statistic is that peak's robust z-score among all scored
insertions: (max score - median) / (1.4826 * MAD). The threshold is not universal: calibrate it on adapters known
to be clean (`calibrate_threshold`), declared before the adapters under test are scanned.

Models are anything called as `model(input_ids=..., attention_mask=...)` returning logits [B, C] (a classifier),
[B, T, V] (a causal LM: the next-token distribution after the last real token is used), or an object with
`.logits`. Both models must share the tokenizer. A PEFT model gives its base with `with model.disable_adapter():`
(`PeftDisabled` wraps that), so `trigger_scan(PeftDisabled(peft_model), peft_model, tokenizer, prompts, cands)`
scans any PEFT LoRA folder once it is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError

POSITIONS = ("prefix", "suffix")
MAD_TO_SD = 1.4826  # the MAD of a normal sample times this estimates its standard deviation


@dataclass(frozen=True)
class ScanConfig:
    """position: where an insertion goes in each prompt; max_length: tokens per input (longer prompts are cut at
    the end, the insertion kept when it is a prefix); batch_size: inputs per forward; beam: the top `beam` single
    insertions are also tried as ordered pairs (beam^2 two-word insertions; 0 = single words only)."""

    position: str = "prefix"
    max_length: int = 32
    batch_size: int = 64
    beam: int = 3

    def validate(self) -> None:
        if self.position not in POSITIONS:
            raise InvalidInputError(f"position must be one of {POSITIONS}, got {self.position!r}")
        if self.max_length < 2 or self.batch_size < 1 or self.beam < 0:
            raise InvalidInputError(f"need max_length >= 2, batch_size >= 1, beam >= 0; got {self}")


@dataclass(frozen=True)
class TriggerScan:
    """The scan of one adapter. insertions [K] (singles, then the beam's pairs), scores [K] (mean effect, nats),
    effects [K, P], base_shift [P] (the shift on the clean prompts)."""

    insertions: tuple[str, ...]
    scores: torch.Tensor
    effects: torch.Tensor
    base_shift: torch.Tensor

    @property
    def top(self) -> str:
        return self.insertions[int(self.scores.argmax())]

    @property
    def concentration(self) -> float:
        """Robust z-score of the strongest insertion's score among all scored insertions."""
        s = self.scores.double()
        med = s.median()
        mad = (s - med).abs().median()
        return float((s.max() - med) / (MAD_TO_SD * mad + 1e-12))

    @property
    def prompt_consistency(self) -> float:
        """Share of prompts on which the top insertion's effect beats every insertion sharing no word with it (the
        beam's pairs that contain the same word are not rivals): near 1 when one insertion drives the shift."""
        top = int(self.scores.argmax())
        words = set(self.insertions[top].split())
        rivals = [i for i, ins in enumerate(self.insertions) if not words & set(ins.split())]
        if not rivals:
            return 1.0
        return float((self.effects[top] > self.effects[rivals].max(0).values).double().mean())

    def flagged(self, threshold: float) -> bool:
        return self.concentration > threshold

    def summary(self) -> dict[str, float | str]:
        return {"top insertion": self.top, "top score (nats)": float(self.scores.max()),
                "median score": float(self.scores.median()), "concentration": self.concentration,
                "prompt consistency": self.prompt_consistency, "mean clean shift": float(self.base_shift.mean())}


class PeftDisabled(nn.Module):
    """The base model of a PEFT model: calls it inside `disable_adapter()` (no copy, the same weights)."""

    def __init__(self, peft_model: nn.Module) -> None:
        super().__init__()
        if not hasattr(peft_model, "disable_adapter"):
            raise InvalidInputError("PeftDisabled needs a peft.PeftModel (it has no disable_adapter())")
        self.peft_model = peft_model

    def forward(self, **inputs):
        with self.peft_model.disable_adapter():
            return self.peft_model(**inputs)


def _insert(prompt: str, insertion: str, position: str) -> str:
    return f"{insertion} {prompt}" if position == "prefix" else f"{prompt} {insertion}"


def _log_probs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [B, C] of the model's output distribution (float64)."""
    out = model(input_ids=ids, attention_mask=mask)
    logits = out.logits if hasattr(out, "logits") else out
    if not isinstance(logits, torch.Tensor) or logits.dim() not in (2, 3):
        raise InvalidInputError("the scanned models must return logits [B, C] or [B, T, V] (or an object with .logits)")
    if logits.dim() == 3:  # causal LM: the next-token distribution after the last real (right-padded) token
        last = mask.long().sum(1).clamp_min(1) - 1
        logits = logits[torch.arange(len(last)), last]
    return F.log_softmax(logits.double(), dim=-1)


@torch.no_grad()
def adapter_shift(base: nn.Module, adapted: nn.Module, tokenizer, texts: Sequence[str],
                  config: ScanConfig | None = None) -> torch.Tensor:
    """KL(p_adapted || p_base) [len(texts)] per text, in nats."""
    config = config or ScanConfig()
    out = []
    for i in range(0, len(texts), config.batch_size):
        enc = tokenizer(list(texts[i: i + config.batch_size]), truncation=True, max_length=config.max_length,
                        padding=True, return_tensors="pt")
        lp_a = _log_probs(adapted, enc["input_ids"], enc["attention_mask"])
        lp_b = _log_probs(base, enc["input_ids"], enc["attention_mask"])
        if lp_a.shape != lp_b.shape:
            raise InvalidInputError(f"base and adapted outputs differ in shape: {tuple(lp_b.shape)} vs {tuple(lp_a.shape)}")
        out.append((lp_a.exp() * (lp_a - lp_b)).sum(-1).clamp_min(0.0))
    return torch.cat(out)


def _check_inputs(prompts: Sequence[str], candidates: Sequence[str]) -> None:
    if not prompts:
        raise InvalidInputError("the trigger scan needs at least one prompt")
    if len(candidates) < 3:
        raise InvalidInputError(f"the trigger scan needs at least 3 candidate insertions to judge a peak, got "
                                f"{len(candidates)}")
    bad = [c for c in candidates if not isinstance(c, str) or not c.strip()]
    if bad:
        raise InvalidInputError(f"candidate insertions must be non-empty strings; got {bad[:3]}")


def trigger_scan(base: nn.Module, adapted: nn.Module, tokenizer, prompts: Sequence[str], candidates: Sequence[str],
                 config: ScanConfig | None = None) -> TriggerScan:
    """Scan `candidates` (single insertions, e.g. rare vocabulary words) inserted into every prompt, then the ordered
    pairs of the `beam` strongest; see the module docstring for the statistic. Both models in eval mode."""
    config = config or ScanConfig()
    config.validate()
    _check_inputs(prompts, candidates)
    for m in (base, adapted):
        m.eval()
    clean = adapter_shift(base, adapted, tokenizer, prompts, config)

    def effects_of(insertions: Sequence[str]) -> torch.Tensor:
        texts = [_insert(p, c, config.position) for c in insertions for p in prompts]
        return adapter_shift(base, adapted, tokenizer, texts, config).view(len(insertions), len(prompts)) - clean

    singles = list(dict.fromkeys(candidates))
    eff = effects_of(singles)
    insertions = singles
    if config.beam:
        best = [singles[i] for i in eff.mean(1).argsort(descending=True)[: config.beam].tolist()]
        pairs = [f"{a} {b}" for a in best for b in best if a != b]
        if pairs:
            eff = torch.cat([eff, effects_of(pairs)])
            insertions = singles + pairs
    return TriggerScan(tuple(insertions), eff.mean(1), eff, clean)


def calibrate_threshold(clean_scans: Sequence[TriggerScan], margin: float = 2.0) -> float:
    """The flag threshold from adapters known to be clean: `margin` times the largest concentration among them."""
    if not clean_scans:
        raise InvalidInputError("calibrating the trigger-scan threshold needs at least one clean adapter's scan")
    if not margin >= 1.0:
        raise InvalidInputError(f"the calibration margin must be >= 1 (a threshold below a clean adapter's own "
                                f"statistic would flag it), got {margin}")
    return margin * max(s.concentration for s in clean_scans)


__all__ = ["PeftDisabled", "ScanConfig", "TriggerScan", "adapter_shift", "calibrate_threshold", "trigger_scan"]
