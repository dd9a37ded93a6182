"""Quantization formats."""

from __future__ import annotations

from rankwise.registry.records import QUANTIZE, BenchmarkEntry, FolderFormat, MethodSpec, record, repro

METHODS: tuple[MethodSpec, ...] = (
    record("microscaling-ue5m3", "Is Finer Better? The Limits of Microscaling Formats in Large Language Models", "quant",
       api=["rankwise.quant.formats:FloatFormat", "rankwise.quant.block:quantize", "rankwise.quant.fake_quant:quantize_linears_",
            "rankwise.quant.storage:save_quantized", "rankwise.quant.error_model:gaussian_terms"],
       experiments=[repro("microscaling-ue5m3", summary="block-size anomaly of UE4M3 scales; UE5M3 without a global scale; torchao parity")],
       demo="rankwise.demos.microscaling_ue5m3:headline",
       commands=[QUANTIZE],
       folder_formats=[FolderFormat("microscaling", "rankwise.quant.storage:load_quantized")],
       benchmarks=[BenchmarkEntry("microscaling", "bench_microscaling.py")],
       docs="docs/methods/microscaling-ue5m3.md"),
)
