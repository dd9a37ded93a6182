"""Calibration for MLA conversion: short token windows in, one uncentred second moment per layer out.

CARE calibrates on 256 samples of 32 tokens (its "alpaca-256-32"; accuracy saturates past ~512 samples and long
sequences overfit). The caller cuts the windows: from a corpus split (`rankwise.data.token_windows(tokenizer,
"calibration", 32)`, or the default mix of an encyclopedic and a technical domain,
`rankwise.data.domains.calibration_mix_windows`), or from the user's own text with `text_calibration_windows`.
`calibration_windows` draws the seeded sample. The whitened methods fit the calibration domain (see
docs/methods/care-mla.md, "Calibration domain"): calibrate on text like the text the model will serve.
The statistics come from the shared pipeline in `core/calibration.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from rankwise.compress.mla.layout import k_proj_names, kv_layout
from rankwise.core.calibration import SecondMoment, collect_second_moments
from rankwise.errors import InvalidInputError, NumericalError

DEFAULT_SAMPLES = 256
DEFAULT_SEQ_LEN = 32
CALIBRATION_BATCH = 32  # windows per forward pass


def calibration_windows(windows: torch.Tensor, samples: int = DEFAULT_SAMPLES, seed: int = 0) -> torch.Tensor:
    """`samples` of the token windows [M, T] drawn without replacement (seeded), kept in their order. -> [N, T]

    `windows`: e.g. `rankwise.data.token_windows(tokenizer, "calibration", DEFAULT_SEQ_LEN)`.
    """
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.numel() == 0:
        raise InvalidInputError(
            "calibration_windows takes token windows [M, T] (e.g. rankwise.data.token_windows(tokenizer, 'calibration', 32)), "
            f"got {type(windows).__name__}{' of shape ' + str(tuple(windows.shape)) if isinstance(windows, torch.Tensor) else ''}"
        )
    if samples < 1:
        raise InvalidInputError(f"calibration needs at least one window, got samples={samples}")
    if windows.size(0) < samples:
        raise InvalidInputError(f"only {windows.size(0)} calibration windows of {windows.size(1)} tokens, fewer than {samples}; "
                                "cut shorter windows or sample fewer")
    order = torch.randperm(windows.size(0), generator=torch.Generator().manual_seed(seed))[:samples]
    return windows[order.sort().values]


def text_calibration_windows(
    tokenizer, text: str | Sequence[str], seq_len: int = DEFAULT_SEQ_LEN, samples: int | None = DEFAULT_SAMPLES, seed: int = 0
) -> torch.Tensor:
    """Calibration windows [N, seq_len] from the user's own text (one string, or several documents).

    The documents are tokenized without special tokens, joined with the EOS token between them and cut into
    non-overlapping windows of `seq_len` tokens (the tail is dropped). `samples` windows are drawn (seeded, kept in
    text order) when there are more; with fewer, or `samples=None`, every window is used. `tokenizer`: a Hugging
    Face tokenizer (the model's own). Raises InvalidInputError for empty text or text shorter than one window.
    """
    if isinstance(text, str):
        text = [text]
    if not isinstance(text, Sequence) or not all(isinstance(t, str) for t in text) or not any(t.strip() for t in text):
        raise InvalidInputError("calibration text must be a non-empty string or a sequence of strings")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise InvalidInputError(f"seq_len must be an integer >= 2, got {seq_len!r}")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise InvalidInputError(f"samples must be a positive integer or None, got {samples!r}")
    ids = tokenizer([t for t in text if t.strip()], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    stream = torch.tensor([t for seq in ids for t in (*seq, eos)], dtype=torch.long)
    n = stream.numel() // seq_len
    if n == 0:
        raise InvalidInputError(f"the calibration text has {stream.numel()} tokens, fewer than one window of {seq_len}; "
                                "pass more text or a shorter seq_len")
    windows = stream[: n * seq_len].view(n, seq_len).clone()
    return windows if samples is None or n <= samples else calibration_windows(windows, samples, seed)


def _batches(calibration: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(calibration, torch.Tensor):
        if calibration.dim() != 2 or calibration.numel() == 0:
            raise InvalidInputError(f"calibration token ids must be a non-empty [N, T] tensor, got shape {tuple(calibration.shape)}")
        return list(calibration.split(CALIBRATION_BATCH))
    batches = list(calibration)
    for b in batches:
        if not isinstance(b, torch.Tensor) or b.dim() != 2 or b.numel() == 0:
            raise InvalidInputError("calibration batches must be non-empty [B, T] token-id tensors")
    return batches


def kv_input_moments(
    model: nn.Module,
    calibration: torch.Tensor | Sequence[torch.Tensor] | Sequence[SecondMoment] | Mapping[str, SecondMoment],
    *,
    min_rows: int | None = None,
    use_cache: bool = True,
) -> list[SecondMoment]:
    """One second moment per layer of the (shared) input of k_proj and v_proj.

    calibration: token ids [N, T], a sequence of [B, T] batches, or moments already collected: one per layer in
    order, or keyed by k_proj module name. At least `min_rows` tokens are required (default: the hidden size, so
    C can have full rank).
    Raises InvalidInputError for empty or too-short data, NumericalError for NaN/Inf activations.
    """
    layout = kv_layout(model)
    names = k_proj_names(model)
    min_rows = layout.hidden_size if min_rows is None else min_rows
    if isinstance(calibration, Mapping):
        missing = [n for n in names if n not in calibration]
        if missing:
            raise InvalidInputError(f"calibration moments lack {missing[:2]}...; key them by k_proj module name")
        moments = [calibration[n] for n in names]
    elif isinstance(calibration, Sequence) and calibration and all(isinstance(m, SecondMoment) for m in calibration):
        if len(calibration) != layout.num_layers:
            raise InvalidInputError(f"got {len(calibration)} calibration moments for {layout.num_layers} layers")
        moments = list(calibration)
    else:
        moments = None
    if moments is not None:
        short = [m.rows for m in moments if m.rows < min_rows]
        if short:
            raise InvalidInputError(f"calibration too short: {min(short)} tokens, need at least {min_rows}; pass more data")
    else:
        batches = _batches(calibration)
        if sum(b.numel() for b in batches) < min_rows:
            raise InvalidInputError(
                f"calibration too short: {sum(b.numel() for b in batches)} tokens, need at least {min_rows} (the hidden size); pass more windows"
            )
        collected = collect_second_moments(model, names, batches, min_rows=min_rows, use_cache=use_cache, desc="calibration (k/v inputs)")
        moments = [collected[n] for n in names]
    for name, m in zip(names, moments):
        if m.sum_xxT.shape != (layout.hidden_size, layout.hidden_size):
            raise InvalidInputError(f"{name}: second moment has shape {tuple(m.sum_xxT.shape)}, expected {layout.hidden_size}x{layout.hidden_size}")
        if not torch.isfinite(m.sum_xxT).all():
            raise NumericalError(f"{name}: the calibration second moment contains NaN or Inf")
    return moments
