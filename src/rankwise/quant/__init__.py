"""Number formats and block quantization: microscaling FP4/FP8 with E8M0, UE4M3 and UE5M3 block scales.

  formats.py      exact minifloat codecs (E2M1, E4M3, E5M2 elements; E8M0, UE4M3, UE5M3 scales)
  (two 4-bit codes per byte: rankwise.core.packing, shared with CodeQuant)
  block.py        block quantization recipes (MXFP4, NVFP4, FP4 with UE4M3 / UE5M3 scales) -> QuantizedTensor
  fake_quant.py   quantize-dequantize of tensors and of a model's nn.Linear layers (activations optional)
  storage.py      packed safetensors folders: save, validated reload (`load_model(folder)`), bytes per weight
  error_model.py  the three-term Gaussian error model and its measured counterpart
"""

from rankwise.quant.block import RECIPES, BlockRecipe, QuantizedTensor, get_recipe, make_recipe, quantize
from rankwise.quant.error_model import ErrorTerms, gaussian_terms, measured_terms, predict_tensor
from rankwise.quant.fake_quant import ErrorStats, FakeQuantLinear, error_stats, fake_quantize, quantize_linears_, quantized_copy
from rankwise.quant.formats import E2M1, E4M3, E5M2, E8M0, FORMATS, UE4M3, UE5M3, FloatFormat, get_format
from rankwise.core.packing import pack_nibbles, unpack_nibbles
from rankwise.quant.storage import load_quantized, save_quantized

__all__ = [
    "FloatFormat", "get_format", "FORMATS", "E2M1", "E4M3", "E5M2", "E8M0", "UE4M3", "UE5M3",
    "pack_nibbles", "unpack_nibbles",
    "BlockRecipe", "RECIPES", "get_recipe", "make_recipe", "quantize", "QuantizedTensor",
    "fake_quantize", "quantize_linears_", "quantized_copy", "FakeQuantLinear", "error_stats", "ErrorStats",
    "save_quantized", "load_quantized",
    "ErrorTerms", "gaussian_terms", "measured_terms", "predict_tensor",
]
