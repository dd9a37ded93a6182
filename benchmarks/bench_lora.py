"""Training-step time and memory: rankwise LoRA vs peft LoRA on SmolLM2-135M, same configuration, one process;
then the other adapter methods' step time relative to rankwise LoRA.

    .venv/bin/python benchmarks/bench_lora.py [--rounds 8] [--batch 2] [--seq 64] [--out docs/results/adapters-benchmark.md] [--smoke]

Fairness: every implementation adapts the same modules with the same rank on its own copy of the same model and
trains with AdamW on the same batch. Steps are interleaved round by round (A, B, C, A, B, C, ...) so that load
from other processes on a shared machine hits all of them alike; we report the median step and the ratio.
Memory: bytes of the tensors autograd saves for backward (measured exactly with saved-tensor hooks, deduplicated
by storage), plus trainable-parameter and AdamW-state bytes, plus the peak RSS growth of the process while the
steps run (noisy: the allocator reuses freed memory). To add a method (e.g. GuardSpace), add an entry to METHODS.
One thread (--threads). --smoke: SmolLM2's tiny random stand-in, one short round, written to a temporary folder.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rankwise.adapters import LoraConfig, PicaConfig, add_adapter  # noqa: E402
from rankwise.core.seed import set_seed  # noqa: E402
from rankwise.core.threads import limit_threads  # noqa: E402
from rankwise.eval import measure  # noqa: E402
from common import benchmark_parser, parse_benchmark_args  # noqa: E402
from memory import saved_tensor_bytes  # noqa: E402
from output import write_benchmark  # noqa: E402
from timing import interleaved_times  # noqa: E402

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
    """GuardSpace protecting 4 x 32 calibration-split tokens (128 < 576 input dims: a real null space; on a narrower
    model, e.g. the smoke stand-in, 4 x hidden/8 tokens)."""
    from rankwise.adapters import find_targets
    from rankwise.adapters.guardspace import GuardSpaceConfig
    from rankwise.core.calibration import collect_second_moments
    from rankwise.data import token_windows
    from rankwise.models import load_smollm2_tokenizer

    config = GuardSpaceConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS)
    seq = min(32, model.config.hidden_size // 8)
    protected = list(token_windows(load_smollm2_tokenizer(), "calibration", seq, 4).split(1))
    stats = collect_second_moments(model, find_targets(model, config), protected)
    return add_adapter(model, config, statistics=stats)


class Trainer:
    def __init__(self, name: str, model: nn.Module, lr: float = 1e-4) -> None:
        self.name, self.model = name, model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=lr)

    def step(self, ids: torch.Tensor) -> float:
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def saved_activation_bytes(self, ids: torch.Tensor) -> int:
        """Bytes autograd keeps for backward in one forward (each storage once; frozen weights are not extra memory)."""
        frozen = [p for p in self.model.parameters() if not p.requires_grad]
        saved, loss = saved_tensor_bytes(lambda: self.model(input_ids=ids, labels=ids).loss, exclude=frozen)
        loss.backward()
        self.opt.zero_grad(set_to_none=True)
        return saved

    def state_bytes(self) -> int:
        """Trainable parameters + their gradients + AdamW's two moments."""
        return 4 * sum(p.numel() * p.element_size() for p in self.params)


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser(__doc__, "adapters-benchmark.md")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    args = parse_benchmark_args(ap, argv, {"rounds": 1, "warmup": 1, "batch": 1, "seq": 16})
    with limit_threads(args.threads):
        return run(args)


def run(args) -> int:
    from rankwise.data import token_windows
    from rankwise.repro.setup import experiment_model

    base, tokenizer = experiment_model("smollm2-135m", "smoke" if args.smoke else "full")
    ids = token_windows(tokenizer, "train", args.seq, args.batch)
    trainers = []
    for name, build in METHODS.items():
        set_seed(0)
        trainers.append(Trainer(name, build(copy.deepcopy(base))))
    rss: dict[str, list[int]] = {tr.name: [] for tr in trainers}

    def timed_step(tr: Trainer) -> Callable[[], None]:
        def go() -> None:
            _, m = measure(tr.step, ids)
            rss[tr.name].append(m.peak_rss_delta_bytes)
        return go

    # warm-up steps first, then the steps interleaved round by round (A, B, C, A, B, C, ...)
    times = interleaved_times({tr.name: timed_step(tr) for tr in trainers}, args.rounds, warmup=args.warmup)
    rss = {name: max(r[args.warmup:]) for name, r in rss.items()}
    ours, peft_ = trainers[0], trainers[1]
    median = {tr.name: times.median(tr.name) for tr in trainers}
    saved = {tr.name: tr.saved_activation_bytes(ids) for tr in trainers}
    lines = [
        "# Adapter training-step benchmark",
        "",
        f"SmolLM2-135M (fp32, CPU, {torch.get_num_threads()} threads), rank {RANK} on {', '.join(TARGETS)} of all "
        f"{len(base.model.layers)} layers, "
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
    ]
    print("\n".join(lines))
    write_benchmark(args.out, lines, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
