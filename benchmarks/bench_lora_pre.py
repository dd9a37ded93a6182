"""Benchmark: LoRA-Pre vs AdamW vs GaLore, side by side in one run.

Two measurements, each interleaving the optimizers round-robin so machine load affects them alike:
  1. full training step (forward + backward + optimizer step) of the reproduction's ~9M-parameter Llama on one
     fixed batch of wiki tokens;
  2. optimizer.step() alone on SmolLM2-135M's real shapes (its first `--layers` blocks, embeddings included), with
     gradients from one backward pass on wiki text; GaLore's SVD refresh step is timed separately and amortised over
     its refresh gap.
Optimizer-state bytes are measured from the state tensors and reported relative to AdamW. One thread (--threads).
Writes Markdown to docs/results/lora-pre/benchmark.md (or --out); --smoke: SmolLM2's tiny random stand-in, one block,
one round, written to a temporary folder.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_lora_pre.py [--repeats 5] [--layers 8] [--smoke]
"""

from __future__ import annotations

import copy
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from rankwise.core.threads import limit_threads
from rankwise.data import token_windows
from rankwise.optim import LoRAPre, LoRAPreMuon, galore_adamw, low_rank_param_groups, optimizer_state_bytes, split_low_rank_params
from rankwise.optim.lora_pre_muon import muon_shape_scale
from rankwise.optim.newton_schulz import newton_schulz5
from rankwise.repro.lora_pre.main import SIZES, pretraining_model
from rankwise.repro.setup import experiment_model
from common import benchmark_parser, parse_benchmark_args
from output import write_benchmark
from timing import best_time, interleaved_times

RANK = 32
GALORE_GAP = 200


def _makers(rank: int, references: bool = False) -> dict[str, Callable[[nn.Module], torch.optim.Optimizer]]:
    """The optimizers compared; with `references`, also LoRA-Pre's per-matrix reference step and plain Muon."""
    r8 = max(1, rank // 8)
    makers = {
        "AdamW": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0, foreach=False),
        "AdamW (fused)": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0, fused=True),
        f"GaLore r={rank}": lambda m: galore_adamw(m, 1e-3, rank, update_proj_gap=GALORE_GAP, scale=0.25),
        f"LoRA-Pre r={rank}": lambda m: LoRAPre(low_rank_param_groups(m, rank), lr=1e-3, weight_decay=0.0),
        f"LoRA-Pre r={r8}": lambda m: LoRAPre(low_rank_param_groups(m, r8), lr=1e-3, weight_decay=0.0),
        f"LoRA-Pre r={rank}, fused dense": lambda m: LoRAPre(low_rank_param_groups(m, rank), lr=1e-3, weight_decay=0.0, fused=True),
        f"LoRA-Pre r={r8}, fused dense": lambda m: LoRAPre(low_rank_param_groups(m, r8), lr=1e-3, weight_decay=0.0, fused=True),
        f"LoRA-Pre (Muon) r={rank}": lambda m: LoRAPreMuon(_muon_groups(m, rank)),
    }
    if references:
        makers[f"LoRA-Pre r={rank}, per-matrix reference"] = lambda m: _reference(LoRAPre(low_rank_param_groups(m, rank), lr=1e-3, weight_decay=0.0))
        makers[f"LoRA-Pre r={r8}, per-matrix reference"] = lambda m: _reference(LoRAPre(low_rank_param_groups(m, r8), lr=1e-3, weight_decay=0.0))
        makers["Muon (dense momentum)"] = lambda m: DenseMuon(_muon_groups(m, rank))
    return makers


def _reference(opt: LoRAPre) -> LoRAPre:
    opt.batched_step = False  # the per-matrix `_factored_step` the batched step is tested against
    return opt


class DenseMuon(LoRAPreMuon):
    """Plain Muon for the factored matrices (a full [p, q] momentum buffer, the same Newton-Schulz and scale),
    AdamW for the rest: the reference LoRA-Pre (Muon) should be compared with, since Newton-Schulz dominates both."""

    batched_step = False

    def _factored_step(self, p: torch.Tensor, group: dict, index: int) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["momentum_buffer"] = torch.zeros_like(p)
        state["step"] += 1
        buf = state["momentum_buffer"].mul_(group["momentum"]).add_(p.grad)
        update = newton_schulz5(buf, group["ns_steps"])
        p.add_(update, alpha=-group["lr"] * muon_shape_scale(*p.shape))


def matmul_floor(model: nn.Module, rank: int, repeats: int) -> tuple[float, float]:
    """(seconds, flops) of the [p, q]-sized matmuls one LoRA-Pre step cannot avoid, per 2-D matrix p x q: the two
    reconstructions m_B m_A and v_B v_A and the four regression products a g^T, b^T g, a |g|^T, b^T |g|, each
    2 p q r flops: 12 p q r in all (AdamW's step is O(p q) elementwise work). Timed alone, best of `repeats`."""
    gen = torch.Generator().manual_seed(0)
    mats = [(torch.randn(p.shape[0], rank, generator=gen), torch.randn(rank, p.shape[1], generator=gen), torch.randn(p.shape, generator=gen))
            for _, p in split_low_rank_params(model)[0]]
    flops = sum(12 * g.numel() * rank for _, _, g in mats)

    def run() -> None:
        for b, a, g in mats:
            b @ a, b @ a, a @ g.T, b.T @ g, a @ g.T, b.T @ g

    return best_time(run, repeats)[0], flops


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
    # the reproduction's pretraining model has its own (byte) vocabulary: fold the wiki token ids into it
    batch = batch % next(iter(runs.values()))[0].config.vocab_size

    def step(model: nn.Module, opt: torch.optim.Optimizer) -> Callable[[], None]:
        def go() -> None:
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return go

    # the warm-up round builds states (and GaLore's first SVD): not timed
    times = interleaved_times({name: step(model, opt) for name, (model, opt) in runs.items()}, repeats, warmup=1)
    return _rows(runs, times.timed)


def optimizer_step_only(model: nn.Module, batch: torch.Tensor, repeats: int) -> tuple[list[dict[str, str]], dict[str, float]]:
    model.train()
    model(input_ids=batch, labels=batch).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    runs = {}
    for name, make in _makers(RANK, references=True).items():
        clone = copy.deepcopy(model)
        runs[name] = (clone, make(clone))

    def set_grads(name: str) -> None:
        for n, p in runs[name][0].named_parameters():
            p.grad = grads[n].clone()

    rounds = interleaved_times({name: opt.step for name, (_, opt) in runs.items()}, repeats, warmup=1, before=set_grads)
    times = rounds.timed
    # the warm-up round builds states; GaLore's step 0 computes every projector by SVD: its refresh cost
    refresh = {name: rounds.warmup[name][0] for name in runs if name.startswith("GaLore")}
    rows = _rows(runs, times)
    for row in rows:
        if row["optimizer"] in refresh:
            regular = statistics.median(times[row["optimizer"]])
            amortised = (refresh[row["optimizer"]] + (GALORE_GAP - 1) * regular) / GALORE_GAP
            row["note"] = f"SVD refresh step {refresh[row['optimizer']] * 1e3:.0f} ms; amortised over {GALORE_GAP} steps {amortised * 1e3:.1f} ms"
    muon = statistics.median(times["Muon (dense momentum)"])
    for row in rows:
        if "Muon" in row["optimizer"]:
            row["note"] = f"{statistics.median(times[row['optimizer']]) / muon:.2f} x plain Muon"
    return rows, {name: statistics.median(t) for name, t in times.items()}


def matrices_only(model: nn.Module, repeats: int) -> tuple[list[dict[str, str]], dict[str, float]]:
    """optimizer.step() on the factored matrices alone (the attention and MLP weights, random gradients): the part
    of the step where LoRA-Pre differs from AdamW, without the embeddings' AdamW that every optimizer shares."""
    gen = torch.Generator().manual_seed(1)
    matrices = [p.detach().clone() for _, p in split_low_rank_params(model)[0]]
    grads = [torch.randn(p.shape, generator=gen) * 1e-3 for p in matrices]
    r8 = max(1, RANK // 8)
    makers = {
        "AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.0, foreach=False),
        "AdamW (fused)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.0, fused=True),
        f"LoRA-Pre r={RANK}": lambda ps: LoRAPre(ps, lr=1e-3, weight_decay=0.0, rank=RANK),
        f"LoRA-Pre r={r8}": lambda ps: LoRAPre(ps, lr=1e-3, weight_decay=0.0, rank=r8),
        f"LoRA-Pre r={RANK}, per-matrix reference": lambda ps: _reference(LoRAPre(ps, lr=1e-3, weight_decay=0.0, rank=RANK)),
        f"LoRA-Pre r={r8}, per-matrix reference": lambda ps: _reference(LoRAPre(ps, lr=1e-3, weight_decay=0.0, rank=r8)),
    }
    runs = {}
    for name, make in makers.items():
        params = [nn.Parameter(m.clone()) for m in matrices]
        for p, g in zip(params, grads):
            p.grad = g
        runs[name] = make(params)
    # the warm-up round builds the states: not timed
    times = interleaved_times({name: opt.step for name, opt in runs.items()}, repeats, warmup=1).timed
    base = statistics.median(times["AdamW"])
    fused = statistics.median(times["AdamW (fused)"])
    rows = [{"optimizer": name, "median step ms": f"{statistics.median(t) * 1e3:.1f}",
             "time / AdamW": f"{statistics.median(t) / base:.2f}", "time / fused AdamW": f"{statistics.median(t) / fused:.2f}"}
            for name, t in times.items()]
    return rows, {name: statistics.median(t) for name, t in times.items()}


def _floor_section(matrix_medians: dict[str, float], floors: dict[int, tuple[float, float]]) -> str:
    """How close LoRA-Pre's step on the matrices is to what its arithmetic allows, from the measured matmul floor.

    Everything here is from the matrices-only measurement: each timing reads the gradients from memory once (the
    matrices together exceed the last-level cache), so the ratios compare like with like."""
    adamw = matrix_medians["AdamW"]
    lines = ["## What the arithmetic allows (the matrices alone, same run)", "",
             "LoRA-Pre's step must do, per matrix p x q, 12 p q r flops of matmuls (`matmul_floor`: two reconstructions "
             "and four regression products, timed alone, best of the rounds) besides elementwise work (the streamed "
             "step does it on L2-sized row blocks, reading each gradient and weight from memory once). The matmuls "
             "alone are a lower bound on its step over the matrices; the ratios below divide by AdamW's step over the "
             "same matrices (the matrices-only table's median).", "",
             "| rank | matmul flops (G) | matmuls alone ms | GFLOP/s | AdamW on the matrices ms | matmul floor / AdamW | measured streamed / AdamW | per-matrix reference / AdamW |",
             "|---|---|---|---|---|---|---|---|"]
    for rank, (sec, flops) in floors.items():
        fast = matrix_medians[f"LoRA-Pre r={rank}"] / adamw
        ref = matrix_medians[f"LoRA-Pre r={rank}, per-matrix reference"] / adamw
        lines.append(f"| {rank} | {flops / 1e9:.2f} | {sec * 1e3:.1f} | {flops / sec / 1e9:.0f} | {adamw * 1e3:.1f} | {sec / adamw:.2f} | {fast:.2f} | {ref:.2f} |")
    lines += ["", "The floor counts the matmuls only, so it is optimistic: a floor ratio above 1.3 means 1.3x AdamW on the "
              "matrices is out of reach on this CPU at that rank, whatever the implementation (the whole step adds the "
              "embeddings' AdamW, the same in every optimizer, which dilutes the ratio). The Muon variant is bounded "
              "by Newton-Schulz (5 iterations of ~6 min(p,q)^2 max(p,q) flops per matrix), which plain Muon pays too: "
              "its ratio to plain Muon, in the table's note, is the cost of the factored momentum.", ""]
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "lora-pre")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per measurement (median reported)")
    parser.add_argument("--layers", type=int, default=8, help="SmolLM2 blocks kept for the optimizer-only timing")
    args = parse_benchmark_args(parser, argv, {"repeats": 1, "layers": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    torch.manual_seed(0)
    smollm2, tokenizer = experiment_model("smollm2-135m", "smoke" if args.smoke else "full")
    smollm2.model.layers = smollm2.model.layers[: args.layers]
    smollm2.config.num_hidden_layers = args.layers
    windows = token_windows(tokenizer, "eval", 128, 8)
    t0 = time.perf_counter()
    step_rows = full_training_step(windows, args.repeats)
    opt_rows, _ = optimizer_step_only(smollm2, windows[:2], args.repeats)
    floors = {r: matmul_floor(smollm2, r, args.repeats) for r in (RANK, max(1, RANK // 8))}
    matrix_rows, matrix_medians = matrices_only(smollm2, args.repeats)
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
        _markdown(f"optimizer.step() on the {args.layers} blocks' attention and MLP matrices alone (random gradients)", matrix_rows),
        "Here the two optimizers differ in every parameter: the streamed factored step against AdamW's per-matrix "
        "elementwise passes. `AdamW` is torch's CPU default (the single-tensor loop, foreach=False); `AdamW (fused)` "
        "its fused kernel (fused=True), which a user can also give LoRA-Pre's dense path (`LoRAPre(..., fused=True)`).",
        "",
        _floor_section(matrix_medians, floors),
    ])
    print(text)
    write_benchmark(args.out, text.split("\n"), smoke=args.smoke)


if __name__ == "__main__":
    main()
