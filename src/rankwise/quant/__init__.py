"""Number formats and block quantization: microscaling FP4/FP8 with E8M0, UE4M3 and UE5M3 block scales."""

from rankwise.quant.formats import E2M1, E4M3, E5M2, E8M0, FORMATS, UE4M3, UE5M3, FloatFormat, get_format

__all__ = ["FloatFormat", "get_format", "FORMATS", "E2M1", "E4M3", "E5M2", "E8M0", "UE4M3", "UE5M3"]
