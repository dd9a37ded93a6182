"""Calibration for MLA conversion: short token windows in, one uncentred second moment per layer out.

CARE calibrates on 256 samples of 32 tokens (its "alpaca-256-32"; accuracy saturates past ~512 samples and long
sequences overfit). The caller cuts the windows (the reproductions and the command use the wiki corpus's
calibration split, disjoint by article from the evaluation split: `rankwise.data.token_windows(tokenizer,
"calibration", 32)`); `calibration_windows` draws the seeded sample from them. The statistics come from the shared
pipeline in `core/calibration.py`.
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
