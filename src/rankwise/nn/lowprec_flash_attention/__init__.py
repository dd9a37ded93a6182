"""Low-precision flash attention: a tiled FA2 forward and backward with emulated bf16 rounding, the rounding bias
it carries (Qiu & Yao, ICLR 2026) and the paper's minimal fix.

`FlashAttention` / `flash_attention` (the layer and the checked function), `FlashConfig` (exact or emulated bf16,
fp32 accumulation, stochastic rounding, the fix), `bf16_round` and `bf16_round_stochastic` (the rounding points),
`fixed_row_max` (the fix), `measure_bias` / `synthetic_rows` (the bias microbenchmark against float64).
"""

from rankwise.nn.lowprec_flash_attention.bias import BiasCase, BiasReading, UNIT_ROUNDOFF, measure_bias, synthetic_rows
from rankwise.nn.lowprec_flash_attention.config import FlashConfig
from rankwise.nn.lowprec_flash_attention.kernel import (FlashAttentionFunction, fixed_row_max, flash_backward,
                                                        flash_forward)
from rankwise.nn.lowprec_flash_attention.layer import FlashAttention, check_inputs, flash_attention
from rankwise.nn.lowprec_flash_attention.rounding import bf16_round, bf16_round_stochastic

__all__ = ["FlashAttention", "flash_attention", "check_inputs", "FlashConfig", "FlashAttentionFunction",
           "flash_forward", "flash_backward", "fixed_row_max", "bf16_round", "bf16_round_stochastic", "BiasCase",
           "BiasReading", "UNIT_ROUNDOFF", "measure_bias", "synthetic_rows"]
