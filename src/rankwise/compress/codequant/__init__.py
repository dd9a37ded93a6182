"""CodeQuant: a learned rotation moves activation outliers into the weights, per-row k-means codebooks absorb them,
and the centroids are fine-tuned with an MoE-aware loss; inference through a lookup-table matmul.

  act_quant.py  Q_a, the per-token asymmetric min-max activation quantizer
  structure.py  where the norms, q/k/v/o, router and experts sit in a Llama-style (MoE) decoder
  rotate.py     norm folding, fusing one orthogonal R into the residual stream, random rotations
  aos.py        activation outlier smoothing: the Cayley-parametrised R trained on calibration activations
  kmeans.py     batched 1-D k-means (k-means++, Lloyd) over rows
  layers.py     RoundedLinear (uniform grids) and ClusteredLinear (codes + centroids)
  accf.py       centroid fine-tuning: module MSE + router KL, mean-gradient SGD, re-assignment
  uniform.py    the equal-bit baselines: tuned RTN and GPTQ
  stats.py      calibration input statistics (Hessians, channel maxima) for GPTQ and SmoothQuant
  scope.py      which linears are quantized (the released code's: q/k/v, router, expert gate/up)
  pipeline.py   the recipe and its baselines as stages: rotate -> [smooth] -> weights -> [fine-tune]
  metrics.py    router top-k agreement, per-module output error
  lut.py        the lookup-table matmul (C++ kernel, lut_kernel.cpp) beside its pure-torch reference
  io.py         the `codequant` folder: save, validated reload
"""

from rankwise.compress.codequant.accf import ACCFConfig, finetune_centroids_
from rankwise.compress.codequant.act_quant import fake_quant, token_codes
from rankwise.compress.codequant.aos import AOSConfig, learn_rotation
from rankwise.compress.codequant.io import load_codequant, save_codequant
from rankwise.compress.codequant.kmeans import kmeans_rows
from rankwise.compress.codequant.layers import ClusteredLinear, RoundedLinear
from rankwise.compress.codequant.metrics import relative_output_errors, router_agreement
from rankwise.compress.codequant.pipeline import QuantResult, QuantSpec, codequant_spec, finish_, quantize_, rotate_stage_
from rankwise.compress.codequant.rotate import fold_norms_, fuse_rotation_, random_orthogonal
from rankwise.compress.codequant.uniform import gptq, rtn

__all__ = [
    "ACCFConfig", "finetune_centroids_", "fake_quant", "token_codes", "AOSConfig", "learn_rotation",
    "load_codequant", "save_codequant", "kmeans_rows", "ClusteredLinear", "RoundedLinear", "relative_output_errors",
    "router_agreement", "QuantResult", "QuantSpec", "codequant_spec", "finish_", "quantize_", "rotate_stage_",
    "fold_norms_", "fuse_rotation_", "random_orthogonal", "gptq", "rtn",
]
