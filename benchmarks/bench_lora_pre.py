"""Benchmark: LoRA-Pre vs AdamW vs GaLore, side by side in one run.

Two measurements, each interleaving the optimizers round-robin so machine load affects them alike:
  1. full training step (forward + backward + optimizer step) of the reproduction's ~9M-parameter Llama on one
     fixed batch of wiki tokens;
  2. optimizer.step() alone on SmolLM2-135M's real shapes (its first `--layers` blocks, embeddings included), with
     gradients from one backward pass on wiki text; GaLore's SVD refresh step is timed separately and amortised over
     its refresh gap.
Optimizer-state bytes are measured from the state tensors and reported relative to AdamW. Writes Markdown to
docs/results/lora-pre/benchmark.md (or --out).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_lora_pre.py [--repeats 5] [--layers 8]
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from rankwise.core.io import write_text_atomic
from rankwise.data import token_windows
from rankwise.models import load_model
from rankwise.optim import LoRAPre, LoRAPreMuon, galore_adamw, low_rank_param_groups, optimizer_state_bytes, split_low_rank_params
from rankwise.registry import repo_root
from rankwise.repro.lora_pre.main import SIZES, pretraining_model

RANK = 32
GALORE_GAP = 200


def _makers(rank: int) -> dict[str, Callable[[nn.Module], torch.optim.Optimizer]]:
    r8 = max(1, rank // 8)
    return {
        "AdamW": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0, foreach=False),
        f"GaLore r={rank}": lambda m: galore_adamw(m, 1e-3, rank, update_proj_gap=GALORE_GAP, scale=0.25),
        f"LoRA-Pre r={rank}": lambda m: LoRAPre(low_rank_param_groups(m, rank), lr=1e-3, weight_decay=0.0),
        f"LoRA-Pre r={r8}": lambda m: LoRAPre(low_rank_param_groups(m, r8), lr=1e-3, weight_decay=0.0),
        f"LoRA-Pre (Muon) r={rank}": lambda m: LoRAPreMuon(_muon_groups(m, rank)),
    }


def _muon_groups(model: nn.Module, rank: int) -> list[dict]:
    """Muon's lr (0.02) for the factored matrices, an AdamW lr for the dense rest (embeddings, norms)."""
    groups = low_rank_param_groups(model, rank)
    for group in groups[1:]:
        group["lr"] = 1e-3
    return groups


def _state_columns(opt: torch.optim.Optimizer, model: nn.Module, ref: tuple[int, int]) -> dict[str, str]:
    matrices = [p for _, p in split_low_rank_params(model)[0]]
    total, matrix = optimizer_state_bytes(opt), optimizer_state_bytes(opt, matrices)
    return {"state MB": f"{total / 2**20:.2f}", "state / AdamW": f"{total / ref[0]:.3f}",
            "matrix state MB": f"{matrix / 2**20:.2f}", "matrix state / AdamW": f"{matrix / ref[1]:.3f}"}


def full_training_step(batch: torch.Tensor, repeats: int) -> list[dict[str, str]]:
    setup = SIZES.full
    runs = {}
    for name, make in _makers(RANK).items():
        model = pretraining_model(setup, 0).train()
        runs[name] = (model, make(model))
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeats + 1):  # the first round builds states (and GaLore's first SVD): not timed
        for name, (model, opt) in runs.items():
            t0 = time.perf_counter()
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:
                times[name].append(time.perf_counter() - t0)
    return _rows(runs, times)


def optimizer_step_only(model: nn.Module, batch: torch.Tensor, repeats: int) -> list[dict[str, str]]:
    model.train()
    model(input_ids=batch, labels=batch).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    runs = {}
    for name, make in _makers(RANK).items():
        clone = copy.deepcopy(model)
        runs[name] = (clone, make(clone))
    times: dict[str, list[float]] = {name: [] for name in runs}
    refresh: dict[str, float] = {}
    for i in range(repeats + 1):
        for name, (clone, opt) in runs.items():
            for n, p in clone.named_parameters():
                p.grad = grads[n].clone()
            t0 = time.perf_counter()
            opt.step()
            elapsed = time.perf_counter() - t0
            if i == 0 and name.startswith("GaLore"):
                refresh[name] = elapsed  # step 0 computes every projector by SVD
            elif i:
                times[name].append(elapsed)
    rows = _rows(runs, times)
    for row in rows:
        if row["optimizer"] in refresh:
            regular = statistics.median(times[row["optimizer"]])
            amortised = (refresh[row["optimizer"]] + (GALORE_GAP - 1) * regular) / GALORE_GAP
            row["note"] = f"SVD refresh step {refresh[row['optimizer']] * 1e3:.0f} ms; amortised over {GALORE_GAP} steps {amortised * 1e3:.1f} ms"
    return rows


def _rows(runs: dict, times: dict[str, list[float]]) -> list[dict[str, str]]:
    ref_model, ref_opt = runs["AdamW"]
    ref = (optimizer_state_bytes(ref_opt), optimizer_state_bytes(ref_opt, [p for _, p in split_low_rank_params(ref_model)[0]]))
    base = statistics.median(times["AdamW"])
    rows = []
    for name, (model, opt) in runs.items():
        med = statistics.median(times[name])
        rows.append({"optimizer": name, "median step ms": f"{med * 1e3:.1f}", "time / AdamW": f"{med / base:.2f}",
                     **_state_columns(opt, model, ref), "note": ""})
    return rows


def _markdown(title: str, rows: list[dict[str, str]]) -> str:
    cols = list(rows[0])
    lines = [f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per measurement (median reported)")
    parser.add_argument("--layers", type=int, default=8, help="SmolLM2 blocks kept for the optimizer-only timing")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)

    smollm2, tokenizer = load_model("smollm2-135m")
    smollm2.model.layers = smollm2.model.layers[: args.layers]
    smollm2.config.num_hidden_layers = args.layers
    windows = token_windows(tokenizer, "eval", 128, 8)
    t0 = time.perf_counter()
    step_rows = full_training_step(windows, args.repeats)
    opt_rows = optimizer_step_only(smollm2, windows[:2], args.repeats)
    n_small = sum(p.numel() for p in pretraining_model(SIZES.full, 0).parameters())
    n_big = sum(p.numel() for p in smollm2.parameters())
    text = "\n".join([
        "# LoRA-Pre benchmark: step time and optimizer-state memory vs AdamW and GaLore",
        "",
        f"Generated by `benchmarks/bench_lora_pre.py --repeats {args.repeats} --layers {args.layers}` in "
        f"{time.perf_counter() - t0:.0f} s; torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}. "
        "Optimizers interleaved round-robin; medians of the timed rounds. Timings on a shared machine are noisy: read the "
        "ratios, not the milliseconds. State bytes are counted from the optimizers' state tensors (numel x itemsize).",
        "",
        _markdown(f"Full training step: reproduction model ({n_small / 1e6:.1f}M parameters), batch 8 x 128 tokens", step_rows),
        _markdown(f"optimizer.step() alone: SmolLM2-135M shapes, first {args.layers} blocks ({n_big / 1e6:.1f}M parameters)", opt_rows),
        "Matrix state = the attention and MLP weight matrices, the only parameters whose states are low rank; embeddings "
        "and norms keep AdamW states in every optimizer, which dominates the total for these small models.",
        "",
    ])
    out = args.out or (repo_root() or Path.cwd()) / "docs" / "results" / "lora-pre" / "benchmark.md"
    write_text_atomic(out, text)
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
