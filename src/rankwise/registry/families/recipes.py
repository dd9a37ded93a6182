"""Training recipes: procedures that are neither an optimizer nor a layer."""

from __future__ import annotations

from rankwise.registry.records import FINETUNE, BenchmarkEntry, LayerEntry, MethodSpec, ProcedureEntry, record, repro

METHODS: tuple[MethodSpec, ...] = (
    record("dfa-feedback-matching", "Enabling Fine-Tuning of Direct Feedback Alignment via Feedback-Weight Matching", "recipes",
       api=["rankwise.recipes.dfa:build", "rankwise.recipes.dfa:DfaProcedure", "rankwise.recipes.dfa:DfaConfig",
            "rankwise.recipes.dfa:feedback_matching", "rankwise.recipes.dfa:weight_matching",
            "rankwise.recipes.dfa:weight_alignment", "rankwise.recipes.dfa:gradient_alignment",
            "rankwise.recipes.dfa:DFALinear", "rankwise.recipes.dfa:DFAOutputLinear"],
       experiments=[repro("dfa-feedback-matching", summary="BP-pretrained FCNs (4 and 6 layers, Fashion-MNIST) "
                          "fine-tuned on upscaled digits with a new head: DFA+FWM vs DFA_fine, DFA_scratch, FWM "
                          "without weight decay, feedback-only and weight-only matching, BP; accuracy right after "
                          "matching, WA and GA; 10 seeds")],
       commands=[FINETUNE],
       procedures=[ProcedureEntry("dfa", "rankwise.recipes.dfa.procedure:build", "rankwise.recipes.dfa.procedure:DfaConfig",
                                  trains="base")],
       benchmarks=[BenchmarkEntry("dfa-memory", "bench_dfa.py")],
       docs="docs/methods/dfa-feedback-matching.md"),
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
    record("lowprec-flash-attention", "Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention", "recipes",
       api=["rankwise.nn.lowprec_flash_attention:FlashAttention", "rankwise.nn.lowprec_flash_attention:flash_attention",
            "rankwise.nn.lowprec_flash_attention:FlashConfig", "rankwise.nn.lowprec_flash_attention:measure_bias"],
       experiments=[repro("lowprec-flash-attention", summary="bf16 rounding bias of the tiled attention output "
                          "without and with the fix vs float64 (5 configurations, 5 seeds); a 2-layer byte GPT in "
                          "emulated bf16 with and without the fix, layer-2 W_Q spectral drift, 3 seeds")],
       layers=[LayerEntry("FlashAttention", "rankwise.nn.lowprec_flash_attention.spec")],
       benchmarks=[BenchmarkEntry("lowprec-flash-attention", "bench_lowprec_flash_attention.py")],
       docs="docs/methods/lowprec-flash-attention.md"),
    record("palc", "PALC: Preference Alignment via Logit Calibration", "recipes",
       api=["rankwise.recipes.palc:LogitCalibrator", "rankwise.recipes.palc:PalcConfig",
            "rankwise.recipes.palc:PalcTrainConfig", "rankwise.recipes.palc:train_offsets",
            "rankwise.recipes.palc:cache_pairs", "rankwise.recipes.palc:greedy_decode",
            "rankwise.recipes.palc:calibrated_logits", "rankwise.recipes.palc:SteeringOffset",
            "rankwise.recipes.palc:preference_accuracy", "rankwise.recipes.palc:drift_from_base"],
       experiments=[repro("palc", summary="frozen SmolLM2 on a wiki relevance preference in response-balanced twins: "
                          "PALC (lr and bottleneck on validation) vs the base, CAA, a steering vector trained with "
                          "PALC's loss and that vector held to PALC's KL; the gamma knob, d_eff, greedy-generation "
                          "relevance by a topic judge, 5 seeds")],
       benchmarks=[BenchmarkEntry("palc-decoding", "bench_palc.py")],
       docs="docs/methods/palc.md"),
    record("portable-adapter", "CAR-LoRA: Training Compression-Aware and Robust LoRA Adapters for Evolving LLMs", "recipes",
       api=["rankwise.recipes.car_lora:CompressedBase", "rankwise.quant.compression_ops:parse_operators",
            "rankwise.recipes.car_lora.procedure:CarLoraProcedure", "rankwise.quant.codebook:quantize_codebook",
            "rankwise.quant.codebook:CodebookRecipe"],
       experiments=[repro("portable-adapter", summary="SmolLM2 top blocks on a wiki topic: one LoRA over resampled int8/nf4/fp4/prune/skip bases vs per-operator adapters and an equally long FP LoRA, on compressed, held-out (int3, int4) and drifted bases, 5 seeds")],
       commands=[FINETUNE], procedures=[ProcedureEntry("car-lora", "rankwise.recipes.car_lora.procedure:car_lora_procedure",
                                  "rankwise.recipes.car_lora.procedure:CarLoraConfig")],
       docs="docs/methods/portable-adapter.md"),
    record("task-arithmetic-fairness", "On Fairness of Task Arithmetic: The Role of Task Vectors", "recipes",
       api=["rankwise.recipes.task_arithmetic:TaskVector", "rankwise.recipes.task_arithmetic:task_vector",
            "rankwise.recipes.task_arithmetic:lora_task_vector", "rankwise.recipes.task_arithmetic:add_vectors",
            "rankwise.recipes.task_arithmetic:scale_sum", "rankwise.recipes.task_arithmetic:merge_per_group",
            "rankwise.recipes.task_arithmetic:inject", "rankwise.recipes.task_arithmetic:fairness_bound",
            "rankwise.recipes.task_arithmetic:subgroup_task_vectors", "rankwise.recipes.task_arithmetic:worst_group",
            "rankwise.recipes.task_arithmetic:fairness_metrics",
            "rankwise.recipes.task_arithmetic:demographic_parity_difference",
            "rankwise.recipes.task_arithmetic:equalized_odds_difference",
            "rankwise.recipes.task_arithmetic:lambda_sweep", "rankwise.recipes.task_arithmetic:select_point"],
       experiments=[repro("task-arithmetic-fairness", summary="COMPAS (six race groups, race withheld), MLP pretrained "
                          "on the decile-score proxy: task addition of six race-group vectors (lambda on validation) "
                          "vs FFT and LoRA on accuracy, DPD and EOD, a scaled-FFT-vector ablation, single-group "
                          "injection vs vector norm with a random-direction control, 10 seeds"),
                    repro("task-arithmetic-fairness", "adult", "the same protocol on Adult: ten sex x race groups "
                          "(sex and race withheld), MLP pretrained on the hours > 40 proxy, 5 epochs, 10 seeds")],
       docs="docs/methods/task-arithmetic-fairness.md"),
    record("trady", "Study of Training Dynamics for Memory-Constrained Fine-Tuning", "recipes",
       api=["rankwise.recipes.trady:build", "rankwise.recipes.trady:TradyProcedure", "rankwise.recipes.trady:rank_layers",
            "rankwise.recipes.trady:LayerRanking", "rankwise.recipes.trady:ChannelSparse", "rankwise.recipes.trady:sgd"],
       experiments=[repro("trady", summary="SmallResNet pretrained on Fashion-MNIST, layers ranked by RGN on rotated "
                          "digits, fine-tuned at 5% of the full memory cost on three targets: TraDy vs S-TopK / D- and "
                          "S-Full Random, S- and D-Det RGN, Velocity and full fine-tuning, 5 seeds; layer-ranking "
                          "stability across targets"),
                    repro("trady", "minilm", "MiniLM's top two layers on wiki-topics (topics 6-11; ranked on topics "
                          "0-5): TraDy vs S-TopK Random, D-Full Random, Velocity and full fine-tuning at the same "
                          "budget, 5 seeds", module="minilm")],
       commands=[FINETUNE],
       procedures=[ProcedureEntry("trady", "rankwise.recipes.trady.procedure:build",
                                  "rankwise.recipes.trady.procedure:TradyConfig", trains="base")],
       benchmarks=[BenchmarkEntry("trady-memory", "bench_trady.py")],
       docs="docs/methods/trady.md"),
    record("wasi", "Efficient Resource-Constrained Training of Transformers via Subspace Optimization", "recipes",
       api=["rankwise.recipes.wasi:WasiLinear", "rankwise.recipes.wasi:WasiProcedure", "rankwise.recipes.wasi:WasiConfig",
            "rankwise.recipes.wasi:build", "rankwise.recipes.wasi:ActivationSubspace", "rankwise.recipes.wasi:choose_options",
            "rankwise.recipes.wasi:measure_options", "rankwise.recipes.wasi:memory_numel", "rankwise.recipes.wasi:training_flops"],
       experiments=[repro("wasi", summary="MiniLM's last MLP fine-tuned on wiki-topics (cached prefix): WASI at eps 0.9 / "
                          "0.6 and low-memory WASI vs vanilla, LoRA, WSI, ASI, SVD truncation + LoRA and a head-only "
                          "control, analytic and measured memory, 5 seeds"),
                    repro("wasi", "vision", "TinyViT pretrained on Fashion-MNIST 0-4, all MLP linears fine-tuned on "
                          "classes 5-9: the same arms and claims, 5 seeds", module="vision")],
       commands=[FINETUNE],
       procedures=[ProcedureEntry("wasi", "rankwise.recipes.wasi.procedure:build",
                                  "rankwise.recipes.wasi.procedure:WasiConfig", trains="base")],
       benchmarks=[BenchmarkEntry("wasi-memory", "bench_wasi.py")],
       docs="docs/methods/wasi.md"),
)
