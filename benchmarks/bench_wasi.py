"""Benchmark: WASI's training memory, measured, beside vanilla fine-tuning, LoRA and WASI's own analytic count.

The paper (and its code) count WASI's memory analytically; here the low-memory variant really holds only L, R and
the Tucker factors of the activations, and one training step of each arm is measured in a fresh process
(`training_memory`): saved activations, the live-tensor peak, the resident-set peak, step time. Arms on MiniLM-L6
(wiki-topics, batch 32 x 128 tokens: WASI on the 12 MLP linears) and on the TinyViT pretrained here on
Fashion-MNIST 0-4 (classes 5-9, batch 64: WASI on the 8 MLP linears): vanilla (the same MLP linears and the head
trained densely, the paper's reference), full fine-tuning, LoRA r=8 on the MLP linears, WASI (low-memory) at
epsilon 0.9 and 0.8, the paper's variant (dense master W), WSI only and ASI only.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_wasi.py [--steps 2] [--smoke]

One thread (--threads). Writes docs/results/wasi/benchmark.md and .png (or --out); --smoke: the tiny stand-ins,
one step, a temporary folder.
"""

from __future__ import annotations

from training_memory import Arm, Workload, benchmark_main

BERT_MLP = r".*(intermediate\.dense|(?<!attention\.)output\.dense)"  # PEFT semantics: the whole name matches
VIT_MLP = r".*mlp\.fc[12]"


def arms(mlp_regex: str, lr_targets: str) -> list[Arm]:
    return [Arm("vanilla (MLP + head)", "full", train_only=mlp_regex.replace(".*", "", 1)),
            Arm("full FT", "full"),
            Arm("LoRA r=8 (MLP)", "lora", targets=lr_targets),
            Arm("WASI eps=0.9", "procedure", "wasi", {"epsilon": 0.9}),
            Arm("WASI eps=0.8", "procedure", "wasi", {"epsilon": 0.8}),
            Arm("WASI paper variant eps=0.9", "procedure", "wasi", {"epsilon": 0.9, "variant": "paper"}),
            Arm("WSI only eps=0.9", "procedure", "wasi", {"epsilon": 0.9, "compress": "weights"}),
            Arm("ASI only eps=0.9", "procedure", "wasi", {"epsilon": 0.9, "compress": "activations"})]


WORKLOADS = [Workload("MiniLM 32x128", "minilm-l6", 32, 128), Workload("TinyViT 64", "tiny-vit-fmnist-0to4", 64)]
ARMS = {"MiniLM 32x128": arms(BERT_MLP, BERT_MLP), "TinyViT 64": arms(VIT_MLP, VIT_MLP)}
NOTES = ["WASI's goal in this project's issue: measured activation + weight memory of the low-memory variant at most "
         "1/5 of vanilla's (read *saved activations* and *model*/*params+grads+Adam* against the vanilla row), at "
         "no more than 1 point of accuracy lost (the accuracy is the reproduction's, docs/results/wasi/). The "
         "pretrained spectra decide the ranks: epsilon is the explained-variance threshold of each weight and "
         "activation at the first step."]


def main(argv: list[str] | None = None) -> None:
    smoke = [Workload("MiniLM 32x128", "minilm-l6", 4, 16), Workload("TinyViT 64", "tiny-vit-fmnist-0to4", 4)]
    benchmark_main(__doc__, "wasi", "WASI: measured training memory vs vanilla, full fine-tuning and LoRA (CPU)",
                   WORKLOADS, ARMS, NOTES, argv, smoke_workloads=smoke)


if __name__ == "__main__":
    main()
