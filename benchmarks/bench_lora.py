"""Training-step time and memory: rankwise LoRA vs peft LoRA on SmolLM2-135M, same configuration, one process;
then the other adapter methods' step time relative to rankwise LoRA.

    .venv/bin/python benchmarks/bench_lora.py [--rounds 8] [--batch 2] [--seq 64] [--out docs/results/adapters-benchmark.md]

Fairness: every implementation adapts the same modules with the same rank on its own copy of the same model and
trains with AdamW on the same batch. Steps are interleaved round by round (A, B, C, A, B, C, ...) so that load
from other processes on a shared machine hits all of them alike; we report the median step and the ratio.
Memory: bytes of the tensors autograd saves for backward (measured exactly with saved-tensor hooks, deduplicated
by storage), plus trainable-parameter and AdamW-state bytes, plus the peak RSS growth of the process while the
steps run (noisy: the allocator reuses freed memory). To add a method (e.g. GuardSpace), add an entry to METHODS.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rankwise.adapters import LoraConfig, PicaConfig, add_adapter  # noqa: E402
from rankwise.core.io import write_text_atomic  # noqa: E402
from rankwise.core.seed import set_seed  # noqa: E402
from rankwise.eval import measure  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]
RANK = 8


def peft_lora(model: nn.Module) -> nn.Module:
    import peft

    return peft.get_peft_model(model, peft.LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, target_modules=TARGETS))


# name -> how to adapt a fresh model copy. The first two are the head-to-head; the rest are timed against ours.
METHODS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "rankwise LoRA": lambda m: add_adapter(m, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS)),
    "peft LoRA": peft_lora,
    "rankwise LoRA (PiSSA init)": lambda m: add_adapter(m, LoraConfig(r=RANK, lora_alpha=2 * RANK, init="pissa", target_modules=TARGETS)),
    "rankwise PiCa": lambda m: add_adapter(m, PicaConfig(r=RANK, target_modules=TARGETS)),
    "rankwise GuardSpace": lambda m: guardspace(m),
}


def guardspace(model: nn.Module) -> nn.Module:
    """GuardSpace protecting 4 x 32 calibration-split tokens (128 < 576 input dims: a real null space)."""
    from rankwise.adapters import find_targets
    from rankwise.adapters.guardspace import GuardSpaceConfig
    from rankwise.core.calibration import collect_second_moments
    from rankwise.data import token_windows
    from rankwise.models import load_smollm2_tokenizer

    config = GuardSpaceConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS)
    protected = list(token_windows(load_smollm2_tokenizer(), "calibration", 32, 4).split(1))
    stats = collect_second_moments(model, find_targets(model, config), protected)
    return add_adapter(model, config, statistics=stats)


class Trainer:
    def __init__(self, name: str, model: nn.Module, lr: float = 1e-4) -> None:
        self.name, self.model = name, model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=lr)
        self.times: list[float] = []

    def step(self, ids: torch.Tensor) -> float:
        t0 = time.perf_counter()
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.times.append(time.perf_counter() - t0)
        return float(loss.detach())

    def saved_activation_bytes(self, ids: torch.Tensor) -> int:
        """Bytes autograd keeps for backward in one forward (each storage once)."""
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
            return t

        frozen = {id(p) for p in self.model.parameters() if not p.requires_grad}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.zero_grad(set_to_none=True)
        weights = {p.untyped_storage().data_ptr() for p in self.model.parameters() if id(p) in frozen}
        return sum(b for ptr, b in storages.items() if ptr not in weights)  # frozen weights are not extra memory

    def state_bytes(self) -> int:
        """Trainable parameters + their gradients + AdamW's two moments."""
        return 4 * sum(p.numel() * p.element_size() for p in self.params)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable timings on a shared machine)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "results" / "adapters-benchmark.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from rankwise.data import token_windows
    from rankwise.models import load_model

    base, tokenizer = load_model("smollm2-135m")
    ids = token_windows(tokenizer, "train", args.seq, args.batch)
    trainers = []
    for name, build in METHODS.items():
        set_seed(0)
        trainers.append(Trainer(name, build(copy.deepcopy(base))))
    for tr in trainers:
        for _ in range(args.warmup):
            tr.step(ids)
        tr.times.clear()
    rss = {}
    for _ in range(args.rounds):
        for tr in trainers:
            _, m = measure(tr.step, ids)
            rss[tr.name] = max(rss.get(tr.name, 0), m.peak_rss_delta_bytes)
    ours, peft_ = trainers[0], trainers[1]
    median = {tr.name: statistics.median(tr.times) for tr in trainers}
    saved = {tr.name: tr.saved_activation_bytes(ids) for tr in trainers}
    lines = [
        "# Adapter training-step benchmark",
        "",
        f"SmolLM2-135M (fp32, CPU, {torch.get_num_threads()} threads), rank {RANK} on {', '.join(TARGETS)} of all 30 layers, "
        f"batch {args.batch} x {args.seq} tokens, AdamW; {args.rounds} interleaved rounds after {args.warmup} warm-up steps each. "
        "Generated by `benchmarks/bench_lora.py`.",
        "",
        "| implementation | trainable params | median step (s) | time vs rankwise LoRA | saved activations (MiB) | params+grads+AdamW (MiB) | peak RSS growth in a step (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for tr in trainers:
        lines.append(
            f"| {tr.name} | {sum(p.numel() for p in tr.params):,} | {median[tr.name]:.3f} | {median[tr.name] / median[ours.name]:.3f}x | "
            f"{saved[tr.name] / 2**20:.1f} | {tr.state_bytes() / 2**20:.2f} | {rss[tr.name] / 2**20:.1f} |"
        )
    time_ratio = median[ours.name] / median[peft_.name]
    mem_ratio = (saved[ours.name] + ours.state_bytes()) / (saved[peft_.name] + peft_.state_bytes())
    lines += [
        "",
        f"**rankwise LoRA vs peft LoRA**: step time {time_ratio:.3f}x (target <= 1.05x: {'met' if time_ratio <= 1.05 else 'NOT met'}), "
        f"training memory (saved activations + state) {mem_ratio:.3f}x (target <= 1.00x: {'met' if mem_ratio <= 1.0 + 1e-9 else 'NOT met'}).",
        "",
        f"Load average during the run: {', '.join(f'{x:.1f}' for x in os.getloadavg())} (the machine is shared; interleaving keeps "
        "the ratios fair, absolute times are inflated by other processes).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    write_text_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
