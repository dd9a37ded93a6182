"""Model conversion and compression (CARE's GQA-to-MLA, CodeQuant)."""

from __future__ import annotations

from rankwise.registry.records import QUANTIZE, BenchmarkEntry, Command, FolderFormat, MethodSpec, record, repro

METHODS: tuple[MethodSpec, ...] = (
    record("care-mla", "CARE: Covariance-Aware and Rank-Enhanced Decomposition for Enabling Multi-Head Latent Attention", "compress",
       api=["rankwise.compress.mla:convert_to_mla", "rankwise.compress.mla:decompose_kv", "rankwise.compress.mla:allocate_ranks",
            "rankwise.compress.mla:save_mla", "rankwise.compress.mla:load_mla", "rankwise.core.linalg:whitened_low_rank",
            "rankwise.compress.mla_deploy:convert_to_deployable_mla", "rankwise.compress.mla_deploy:export_deepseek_v3",
            "rankwise.compress.mla:text_calibration_windows"],
       experiments=[repro("care-mla", summary="one-shot GQA->MLA on SmolLM2: CARE vs plain SVD and SVD-LLM, uniform vs adjusted ranks over calibration seeds, perplexity and next-sentence accuracy", threads=None),
                    repro("care-mla", "deploy", "latent-only KV cache, absorbed decoding, DeepSeek-V3 export; CARE vs MHA2MLA (joint latent, 2-norm pairs) inits after 300 equal healing steps", threads=None),
                    repro("care-mla", "deploy-palu", "CARE vs Palu (plain SVD) inits of the deployable MLA after 300 equal healing steps", threads=None, module="deploy_palu"),
                    repro("care-mla", name="domain", summary="calibration domain: calibrate on wiki or Python-reference prose, evaluate on the other; the mix, in-domain amounts, covariance spectrum, near-full rank", module="domain")],
       demo="rankwise.demos.care_mla:headline",
       commands=[Command("convert mla", "rankwise.commands.convert_mla")],
       folder_formats=[FolderFormat("mla-oneshot", "rankwise.compress.mla.io:load_mla")],
       benchmarks=[BenchmarkEntry("mla-deploy", "bench_mla_deploy.py")],
       docs="docs/methods/care-mla.md"),
    record("codequant", "CodeQuant: Unified Clustering and Quantization for Enhanced Outlier Smoothing in Low-Precision Mixture-of-Experts", "compress",
       api=["rankwise.compress.codequant:quantize_", "rankwise.compress.codequant:QuantSpec",
            "rankwise.compress.codequant:codequant_spec", "rankwise.compress.codequant:learn_rotation",
            "rankwise.compress.codequant:ClusteredLinear", "rankwise.compress.codequant:finetune_centroids_",
            "rankwise.compress.codequant:save_codequant", "rankwise.compress.codequant:load_codequant",
            "rankwise.compress.codequant.lut:lut_matmul", "rankwise.compress.codequant:gptq"],
       experiments=[repro("codequant", summary="A4W4 on a small MoE LM trained here: CodeQuant vs RTN, SmoothQuant, "
                          "QuaRot-like, QuaRot+GPTQ, SpinQuant-like at equal bits, tuned; NLL and router agreement"),
                    repro("codequant", "smollm2", "the rotation claims on SmolLM2's real activation outliers: A4 under "
                          "no / random / learned rotation, A4W4 arms as in main (dense: each MLP one expert)",
                          threads=None)],
       commands=[QUANTIZE],
       folder_formats=[FolderFormat("codequant", "rankwise.compress.codequant.io:load_codequant")],
       benchmarks=[BenchmarkEntry("codequant", "bench_codequant.py")],
       docs="docs/methods/codequant.md"),
)
