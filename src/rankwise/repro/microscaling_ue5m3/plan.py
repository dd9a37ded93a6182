"""The plan of the microscaling-ue5m3 reproduction: formats, operating points, margins and sizes, shared by its
sections (A synthetic, B real weights, C model level)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwise.repro.microscaling_ue5m3.regimes import REGIME_TARGETS_LOG2
from rankwise.repro.setup import BySize

SLUG = "microscaling-ue5m3"
TITLE = "Is Finer Better? The Limits of Microscaling Formats in Large Language Models"
# Scale variants of the paper (FP4 E2M1 elements throughout); "-S" adds the per-tensor fp32 scale.
SCALES = {"fp32": "fp4-fp32", "E8M0": "mxfp4", "UE4M3": "fp4-ue4m3", "UE4M3-S": "fp4-ue4m3-s",
          "UE5M3": "fp4-ue5m3", "UE5M3-S": "fp4-ue5m3-s"}
SYNTH_SCALES = ("fp32", "E8M0", "UE4M3", "UE4M3-S", "UE5M3")
MODEL_SCALES = ("UE4M3", "UE4M3-S", "UE5M3")
REGIMES = ("as-is", "normal", "subnormal", "flush", "saturate")
EMBED_REGIMES = ("as-is", "subnormal", "flush")
CARD_CROSSOVER_SIGMA = 2e-2  # the card: UE4M3 block 8 becomes worse than block 16 below sigma ~ 0.02
POST_HOC = "[post hoc: added in issue 16 after the 2026-12-01 full run, declared before this run]"
RESTATED = ("[restated in issue 16 after the 2026-12-01 full run, declared before this run; it was at a global "
            "alpha = 0.03, where 99.6% of UE4M3 blocks flush at both block sizes]")
SUBNORMAL = f"the subnormal point (median block scale 2^{REGIME_TARGETS_LOG2['subnormal']:g} per tensor)"
PPL_MARGIN_SUBNORMAL = 1.01  # perplexity ratios declared before the first run at these points
PPL_MARGIN_SATURATE = 1.5


@dataclass(frozen=True)
class Settings:
    sigmas: tuple[float, ...]
    synth_ks: tuple[int, ...]
    synth_elements: int
    weight_ks: tuple[int, ...]
    smol_layer_stride: int  # SmolLM2 weight sweep: every n-th decoder layer
    model_ks: tuple[int, ...]
    sentences: int
    ppl_ks: tuple[int, ...]
    ppl_windows: int
    seq_len: int
    error_model_layers: tuple[int, ...]  # MiniLM encoder layers whose tensors get the per-tensor error model
    error_model_ks: tuple[int, ...]


SIZES = BySize(
    smoke=Settings(tuple(np.geomspace(1e-4, 10**-0.5, 4)), (8, 16), 2**12, (8, 16), 1, (8, 16), 4, (8, 16), 3, 32,
                   (0,), (8,)),
    full=Settings(tuple(np.geomspace(1e-4, 10**-0.5, 30)), (4, 8, 16, 32), 2**18, (8, 16, 32, 64), 6,
                  (8, 16, 32, 64), 96, (8, 16, 32), 12, 256, (0, 5), (8, 16)),
)
