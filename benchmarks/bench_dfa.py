"""Benchmark: DFA's training memory, measured, beside backprop (full and on the same layers) and LoRA.

Direct feedback alignment replaces the backward pass: each linear's update is its fixed feedback matrix times the
output error, so nothing between the layers needs to be kept for a backward, while backprop keeps every operation's
inputs (norms, GELUs, attention probabilities, residual sums). One training step of each arm, measured in a fresh
process (`training_memory`): saved activations, the live-tensor peak, the resident-set peak, step time, beside the
procedure's analytic count. Arms on MiniLM-L6 (wiki-topics, batch 32 x 128 tokens) and on the TinyViT pretrained
here on Fashion-MNIST 0-4 (classes 5-9, batch 64): backprop on every weight (full FT), backprop on the layers DFA
trains (every linear, norms and embeddings frozen), LoRA r=8 on every linear, plain DFA and DFA with feedback-weight
matching. On a plain MLP the two would save the same (each linear keeps its input either way): the saving is in
the operations between the linears, which is why the transformer backbones are the benchmark.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_dfa.py [--steps 2] [--smoke]

One thread (--threads). Writes docs/results/dfa-feedback-matching/benchmark.md and .png (or --out); --smoke: the
tiny stand-ins, one step, a temporary folder.
"""

from __future__ import annotations

from training_memory import Arm, Workload, benchmark_main

BERT_LINEARS = r"(query|key|value|dense)\.(weight|bias)$"  # every nn.Linear of a BERT encoder
VIT_LINEARS = r"(embed|qkv|proj|fc1|fc2)\.(weight|bias)$"  # every nn.Linear of the TinyViT


def arms(linears: str, lora_targets: list[str]) -> list[Arm]:
    return [Arm("BP full FT", "full"),
            Arm("BP (linears only)", "full", train_only=linears),
            Arm("LoRA r=8 (linears)", "lora", targets=tuple(lora_targets)),
            Arm("DFA", "procedure", "dfa", {"matching": "none"}),
            Arm("DFA + FWM", "procedure", "dfa", {"matching": "fwm"})]


WORKLOADS = [Workload("MiniLM 32x128", "minilm-l6", 32, 128), Workload("TinyViT 64", "tiny-vit-fmnist-0to4", 64)]
ARMS = {"MiniLM 32x128": arms(BERT_LINEARS, ["query", "key", "value", "dense"]),
        "TinyViT 64": arms(VIT_LINEARS, ["qkv", "proj", "fc1", "fc2"])}
NOTES = ["DFA's goal in this project's issue: its backward memory below backprop's (read *saved activations* and "
         "*above state* against the backprop rows; the same layers are trained in \"BP (linears only)\"). DFA trades "
         "accuracy for it (docs/results/dfa-feedback-matching/ has the fine-tuning comparison)."]


def main(argv: list[str] | None = None) -> None:
    smoke = [Workload("MiniLM 32x128", "minilm-l6", 4, 16), Workload("TinyViT 64", "tiny-vit-fmnist-0to4", 4)]
    benchmark_main(__doc__, "dfa-feedback-matching", "DFA: measured training memory vs backprop and LoRA (CPU)",
                   WORKLOADS, ARMS, NOTES, argv, smoke_workloads=smoke)


if __name__ == "__main__":
    main()
