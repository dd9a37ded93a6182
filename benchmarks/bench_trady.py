"""Benchmark: TraDy's training memory at its budget, measured, beside full fine-tuning, LoRA and the baselines.

TraDy trains a random subset of input channels within a memory budget and keeps, for the backward, only the drawn
channels' activation slices (`recipes.trady.sparse_layers`); the paper counts this analytically. One training step
of each arm, measured in a fresh process (`training_memory`): saved activations, the live-tensor peak, the
resident-set peak, step time, beside the procedure's analytic count (the drawn channels' activations and weight
gradients, the head's). Arms on the SmallResNet pretrained here on Fashion-MNIST (14x14, batch 64) and on MiniLM-L6
(wiki-topics, batch 32 x 128 tokens): full fine-tuning, the head alone (the floor: no backbone gradient at all),
TraDy at 5% and 10% of the full per-example cost (every eligible layer in the pool, channels redrawn each epoch),
the static deterministic-RGN baseline and Velocity at 5%, and LoRA r=8 on MiniLM's query/value (PEFT's default).
Every arm trains with AdamW here (the paper uses SGD: TraDy's slices then hold no optimizer state).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_trady.py [--steps 2] [--smoke]

One thread (--threads). Writes docs/results/trady/benchmark.md and .png (or --out); --smoke: the tiny stand-ins,
one step, a temporary folder.
"""

from __future__ import annotations

from training_memory import Arm, Workload, benchmark_main

NOTHING = r"$^"  # train_only: no backbone weight (the task's new head still trains)


def arms(lora: bool) -> list[Arm]:
    return [Arm("full FT", "full"),
            Arm("head only", "full", train_only=NOTHING),
            *([Arm("LoRA r=8 (q,v)", "lora", targets=("query", "value"))] if lora else []),
            Arm("TraDy 5%", "procedure", "trady", {"budget": 0.05}),
            Arm("TraDy 10%", "procedure", "trady", {"budget": 0.10}),
            Arm("S-Det RGN 5%", "procedure", "trady", {"budget": 0.05, "selection": "rgn", "dynamic": False}),
            Arm("Velocity 5%", "procedure", "trady", {"budget": 0.05, "selection": "velocity"})]


WORKLOADS = [Workload("ResNet 14x14 64", "resnet-small-fmnist", 64), Workload("MiniLM 32x128", "minilm-l6", 32, 128)]
ARMS = {"ResNet 14x14 64": arms(lora=False), "MiniLM 32x128": arms(lora=True)}
NOTES = ["TraDy's goal in this project's issue: its activation memory at its budget equal to the budget, measured. "
         "Read *saved activations* minus the head-only row (what the backbone's backward keeps: the drawn slices, "
         "and what the backward must keep to carry the error down to the lowest drawn layer: ReLU masks, norms, "
         "attention) against the analytic *activations* (the drawn slices alone, the paper's count)."]


def main(argv: list[str] | None = None) -> None:
    smoke = [Workload("ResNet 14x14 64", "resnet-small-fmnist", 4), Workload("MiniLM 32x128", "minilm-l6", 4, 16)]
    benchmark_main(__doc__, "trady", "TraDy: measured training memory at its budget vs full fine-tuning (CPU)",
                   WORKLOADS, ARMS, NOTES, argv, smoke_workloads=smoke)


if __name__ == "__main__":
    main()
