"""Training recipes: procedures that are neither an optimizer nor a layer."""

from __future__ import annotations

from rankwise.registry.records import FINETUNE, MethodSpec, ProcedureEntry, record, repro

METHODS: tuple[MethodSpec, ...] = (
    record("dfa-feedback-matching", "Enabling Fine-Tuning of Direct Feedback Alignment via Feedback-Weight Matching", "recipes"),
    record("diff-interpretation-tuning", "Learning to Interpret Weight Differences in Language Models", "recipes"),
    record("loss-curve-collapse", "Scaling with Collapse: Efficient and Predictable Training of LLM Families", "recipes",
       api=["rankwise.recipes.loss_curve_collapse:normalise", "rankwise.recipes.loss_curve_collapse:Curve",
            "rankwise.recipes.loss_curve_collapse:timescale", "rankwise.recipes.loss_curve_collapse:timescale_adamw",
            "rankwise.recipes.loss_curve_collapse:fit_divisor", "rankwise.recipes.loss_curve_collapse:residual",
            "rankwise.recipes.loss_curve_collapse:collapse_spread", "rankwise.data.compact_vocab:byte_tokenizer"],
       experiments=[repro("loss-curve-collapse", summary="byte-level muP LM family (widths 16/32/48, TPP 10, linear "
                           "decay to zero): collapse with tau fixed vs lambda fixed vs mixed TPP, muP LR transfer, 5 seeds"),
                    repro("loss-curve-collapse", "faults", "the residual from collapse as a fault detector on width 48 "
                          "(LR spike, stuck loader) vs the raw-loss rule, false alarms on 5 clean runs",
                          module="detection"),
                    repro("loss-curve-collapse", "early-stop", "LR sweep at width 32 ranked from its first 30% aligned "
                          "to width-16 references: tau fixed vs lambda fixed, 5 seeds", module="early_stop")],
       docs="docs/methods/loss-curve-collapse.md"),
    record("lowprec-flash-attention", "Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention", "recipes"),
    record("palc", "PALC: Preference Alignment via Logit Calibration", "recipes"),
    record("portable-adapter", "CAR-LoRA: Training Compression-Aware and Robust LoRA Adapters for Evolving LLMs", "recipes",
       api=["rankwise.recipes.car_lora:CompressedBase", "rankwise.quant.compression_ops:parse_operators",
            "rankwise.recipes.car_lora.procedure:CarLoraProcedure", "rankwise.quant.codebook:quantize_codebook",
            "rankwise.quant.codebook:CodebookRecipe"],
       experiments=[repro("portable-adapter", summary="SmolLM2 top blocks on a wiki topic: one LoRA over resampled int8/nf4/fp4/prune/skip bases vs per-operator adapters and an equally long FP LoRA, on compressed, held-out (int3, int4) and drifted bases, 5 seeds")],
       commands=[FINETUNE], procedures=[ProcedureEntry("car-lora", "rankwise.recipes.car_lora.procedure:car_lora_procedure",
                                  "rankwise.recipes.car_lora.procedure:CarLoraConfig")],
       docs="docs/methods/portable-adapter.md"),
    record("task-arithmetic-fairness", "On Fairness of Task Arithmetic: The Role of Task Vectors", "recipes"),
    record("trady", "Study of Training Dynamics for Memory-Constrained Fine-Tuning", "recipes"),
    record("wasi", "Efficient Resource-Constrained Training of Transformers via Subspace Optimization", "recipes"),
)
