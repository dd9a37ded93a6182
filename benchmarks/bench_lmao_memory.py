"""Benchmark: peak memory of LMAO vs first-order LoRA, MeZO and full fine-tuning, side by side in one run.

The paper's memory claim: LMAO's peak equals LoRA's (the ZO phase keeps no activations), MeZO's is lower (no backward
at all), full fine-tuning's is far higher (gradients and Adam moments of every weight). Here on the CPU, with the whole
MiniLM-L6 (22.7M parameters, every layer adapted: the paper's setting, no cached prefix) + a 12-class head on
wiki-topics batches of 32 tokens. Each arm runs in a fresh process (so one arm's freed memory cannot serve another);
the process's peak resident memory is reset just before the measured training steps (Linux `/proc/self/clear_refs`)
and read afterwards (`VmHWM`). "Training memory" is that peak minus the resident memory of the same process with the
model and batch loaded, before the arm is built. Large allocations are forced to mmap (`MALLOC_MMAP_THRESHOLD_`), so
freed tensors leave the resident set. Step times (mean of the measured steps) are reported beside, for scale.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_lmao_memory.py [--batches 16,64] [--steps 2] [--smoke]

One thread (--threads). Writes docs/results/lmao/benchmark.md (or --out); --smoke: MiniLM's tiny random stand-in, one
small batch and one step, written to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from common import benchmark_parser, parse_benchmark_args
from output import write_benchmark

ARMS = ("LoRA (first-order)", "LMAO (exact)", "LMAO (in-place)", "MeZO", "full FT (AdamW)")


def _status(field: str) -> int:
    """A /proc/self/status memory field, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(arm: str, batch_size: int, steps: int, smoke: bool = False) -> dict:
    """Build `arm` on MiniLM (its tiny stand-in with `smoke`), train `steps` steps after one warm-up step; the peak
    resident memory of those steps."""
    import torch

    from rankwise.adapters import LoraConfig, add_adapter
    from rankwise.optim.zeroth_order import SPSA, step_seed
    from rankwise.repro.setup import experiment_model
    from rankwise.training import topic_classification
    from rankwise.optim.lmao.procedure import lmao_procedure

    torch.manual_seed(0)
    model, tok = experiment_model("minilm-l6", "smoke" if smoke else "full")
    task = topic_classification(tok, 32, 4 * batch_size, 8)
    batch = task.batch(torch.arange(batch_size))
    baseline = _status("VmRSS")
    if arm.startswith(("LoRA", "LMAO")):
        model = add_adapter(model, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"]))
    else:
        model.requires_grad_(arm.startswith("full"))
    module = task.wrap(model)
    module.train()
    proc = None
    if arm.startswith("LMAO"):
        proc = lmao_procedure(module, task, 0, base_lr=1e-6, perturbation="in-place" if "in-place" in arm else "exact")
    if arm == "MeZO":
        module.requires_grad_(False)
        spsa = SPSA(module, list(module.named_parameters()), 1e-3)
        opt = None
    else:
        opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-4)

    def step(i: int) -> None:
        if opt is None:
            module.eval()
            with torch.inference_mode():
                plus, minus, g = spsa.projected_gradient(lambda: task.loss(module, batch), step_seed(0, i))
            spsa.step_from(plus, minus, g, step_seed(0, i), 1e-6)
            return
        loss = task.loss(module, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if proc is not None:
            proc.after_step(i, module, task, batch)

    step(0)  # the optimizer's state exists from here on: it is part of the peak, as on a GPU
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set size to the current one
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        step(i)
    wall = (time.perf_counter() - t0) / steps
    peak = _status("VmHWM")
    fo = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return {"arm": arm, "batch": batch_size, "peak_rss": peak, "baseline_rss": baseline, "training_bytes": peak - baseline,
            "step_s": wall, "first_order_params": fo, "zo_params": proc.spsa.numel if proc else (spsa.numel if opt is None else 0)}


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "lmao")
    parser.add_argument("--batches", default="16,64", help="comma-separated batch sizes (32 tokens each)")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per arm (after one warm-up step)")
    parser.add_argument("--arm", action="append", help=argparse.SUPPRESS)  # internal: measure these arms in this process
    parser.add_argument("--batch", type=int, default=16, help=argparse.SUPPRESS)
    args = parse_benchmark_args(parser, argv, {"batches": "4", "steps": 1})
    if args.arm is not None:
        from rankwise.core.threads import limit_threads

        with limit_threads(args.threads):
            for arm in args.arm:
                print(json.dumps(measure(arm, args.batch, args.steps, args.smoke)), flush=True)
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "RANKWISE_QUIET": "1"}
    rows = []
    # one fresh process per arm and batch size; a smoke run measures every arm in one process (seconds, not minutes:
    # each process pays the imports; its numbers are not the benchmark anyway)
    groups = [list(ARMS)] if args.smoke else [[arm] for arm in ARMS]
    for b in [int(x) for x in args.batches.split(",")]:
        for arms in groups:
            child = [sys.executable, __file__, "--batch", str(b), "--steps", str(args.steps), "--threads",
                     str(args.threads), "--out", str(args.out), *(["--smoke"] if args.smoke else [])]
            for arm in arms:
                child += ["--arm", arm]
            done = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
            for line in done.stdout.strip().splitlines()[-len(arms):]:
                rows.append(json.loads(line))
                print(rows[-1], flush=True)

    lines = ["# LMAO: peak training memory vs LoRA, MeZO and full fine-tuning (CPU)", "",
             "MiniLM-L6 (all 6 layers, 22.7M parameters) + a 12-class head, wiki-topics batches of 32 tokens; LoRA r=8 on "
             "query/value; LMAO's W = every non-LoRA tensor (embeddings and LayerNorms included, the reference code's "
             "choice). One process per arm; peak resident memory over "
             f"{args.steps} training steps after a warm-up step, minus the resident memory with the model and batch "
             "loaded. Ratios are what to read; absolute numbers include the allocator's and torch's own overheads.", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
             f"{args.threads} thread{'s' if args.threads != 1 else ''}; "
             f"torch {__import__('torch').__version__}.", "",
             "| batch | arm | FO params | ZO params | training memory (MB) | / LoRA | / MeZO | peak RSS (MB) | step s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for b in sorted({r["batch"] for r in rows}):
        group = {r["arm"]: r for r in rows if r["batch"] == b}
        lora, mezo = group[ARMS[0]]["training_bytes"], group["MeZO"]["training_bytes"]
        for arm in ARMS:
            r = group[arm]
            lines.append(f"| {b} | {arm} | {r['first_order_params']:,} | {r['zo_params']:,} | {r['training_bytes'] / 2**20:.1f} | "
                         f"{r['training_bytes'] / lora:.2f} | {r['training_bytes'] / mezo:.2f} | {r['peak_rss'] / 2**20:.0f} | "
                         f"{r['step_s']:.3f} |")
    write_benchmark(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
