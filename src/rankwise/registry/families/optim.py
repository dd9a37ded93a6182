"""Optimizers and optimizer-like training rules."""

from __future__ import annotations

from rankwise.registry.records import BenchmarkEntry, FINETUNE, MethodSpec, OptimizerEntry, ProcedureEntry, record, repro

METHODS: tuple[MethodSpec, ...] = (
    record("lmao", "Three Forward, One Backward: Memory-Efficient Full-Rank Fine-Tuning of Large Models via Extra Forward Passes", "optim",
       api=["rankwise.optim.zeroth_order:SPSA", "rankwise.optim.zeroth_order:mezo_step", "rankwise.optim.lmao:LmaoConfig",
            "rankwise.optim.lmao:select_base_tensors", "rankwise.optim.lmao.procedure:LmaoProcedure", "rankwise.optim.lmao.procedure:lmao_procedure"],
       experiments=[repro("lmao", summary="MiniLM few-shot (k=16) wiki-topics, top-2-layer variant, 120 steps: LMAO vs first-order LoRA, MeZO and full FT, each arm's rates on validation, 5 seeds"),
                    repro("lmao", "digits", "the card's rank bottleneck: digits MLP pretrained on mirrored images, LoRA r=2 vs LMAO, MeZO from the same warm network and full FT, 5 seeds")],
       commands=[FINETUNE], procedures=[ProcedureEntry("lmao", "rankwise.optim.lmao.procedure:lmao_procedure", "rankwise.optim.lmao:LmaoConfig")],
       benchmarks=[BenchmarkEntry("lmao-memory", "bench_lmao_memory.py")],
       docs="docs/methods/lmao.md"),
    record("lora-pre", "Taming Momentum: Rethinking Optimizer States Through Low-Rank Approximation", "optim",
       api=["rankwise.optim:LoRAPre", "rankwise.optim:LoRAPreMuon", "rankwise.optim:low_rank_param_groups",
            "rankwise.optim:galore_adamw", "rankwise.optim:optimizer_state_bytes"],
       experiments=[repro("lora-pre", summary="momentum tracking (3 streams) and byte-level Llama pretraining, 2,000 steps: AdamW, GaLore, LoRA-Pre from its zero and SVD starts, own lr grids, 3 seeds"),
                    repro("lora-pre", name="finetune", module="finetune_exp", summary="MiniLM top-layer fine-tuning on wiki-topics, 1,000 steps: LoRA-Pre vs LoRA (same rank) and AdamW, own lr grids, shared head lr, 3 seeds")],
       demo="rankwise.demos.lora_pre:headline", commands=[FINETUNE], optimizers=[OptimizerEntry("lora-pre", "rankwise.optim.factories:lora_pre", low_rank=True)],
       benchmarks=[BenchmarkEntry("lora-pre", "bench_lora_pre.py")],
       docs="docs/methods/lora-pre.md"),
)
