"""What the training-memory benchmarks share (WASI, TraDy, DFA): one training step of an arm on a workload, measured.

An arm is full fine-tuning, LoRA, or a base-training procedure of the registry (`wasi`, `trady`, `dfa`) with its
options; a workload is a model, a task and one batch (MiniLM-L6 on wiki-topics at 32 x 128 tokens, a vision
backbone on Fashion-MNIST 5-9, ...). The step is exactly the loop's (`core.training.loop`): the procedure's
`before_micro_batch`, the task's loss (+ `extra_loss`), backward, AdamW's step, `after_step`.

Each arm runs in a fresh process, so that memory one arm freed cannot serve the next; large allocations are forced to
mmap (`MALLOC_MMAP_THRESHOLD_`), so that freed tensors leave the resident set. Four measurements per arm:

- **peak RSS** of the measured steps (Linux: `/proc/self/clear_refs` resets the high-water mark, `VmHWM` reads it),
  minus the resident memory with the model and batch loaded, before the arm is built ("training memory");
- **tensor peak**: the largest sum of live tensor bytes during one step (`memory.live_tensor_peak`: every storage
  from its creation to its release, parameters, optimizer states and batch included): the CPU's counterpart of
  CUDA's allocator peak, free of the allocator's and the interpreter's noise; "tensor peak above state" subtracts
  what was live before the step (the weights, optimizer states and batch);
- **saved bytes**: what autograd saves for the backward during the forward (`memory.saved_tensor_bytes`, each
  storage once, parameters and buffers excluded): the activation memory, exact and deterministic;
- **state bytes**: trainable parameters, their gradients and the optimizer's states;

and, beside them, the method's own analytic count (`procedure.analytic_memory(batch)`, where it has one) and the
mean step time of the measured steps.

Benchmarks are scripts (`python benchmarks/bench_X.py`), so this module is imported from the script's own folder;
run as a program it is the child process that measures arms (`python training_memory.py SPEC_JSON`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MB = 2**20


@dataclass(frozen=True)
class Arm:
    """`kind`: "full" (every weight trained, or only those whose name `train_only` (a regex) finds, and the task's
    new head), "lora" (LoRA r=`rank` on `targets`: PEFT's target_modules, a list of suffixes or a regex, the base
    frozen) or "procedure" (full fine-tuning run by the registry's procedure `procedure` with `options`)."""

    label: str
    kind: str
    procedure: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    rank: int = 8
    targets: tuple[str, ...] | str = ()
    train_only: str | None = None


@dataclass(frozen=True)
class Workload:
    """`model`: "minilm-l6" (wiki-topics at `seq_len` tokens) or a vision backbone recipe of `models.vision`
    ("tiny-vit-fmnist-0to4", "resnet-small-fmnist": Fashion-MNIST 5-9 at the backbone's image size); `batch` rows."""

    label: str
    model: str
    batch: int
    seq_len: int = 128


def _status(name: str) -> int:
    """A /proc/self/status memory field, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {name} in /proc/self/status")


def _load(workload: Workload, smoke: bool) -> tuple[Any, Any, dict]:
    """(model, task, batch) for the workload: the real model, or its seeded stand-in with `smoke`."""
    import torch

    if workload.model == "minilm-l6":
        from rankwise.repro.setup import experiment_model
        from rankwise.training import topic_classification

        model, tok = experiment_model("minilm-l6", "smoke" if smoke else "full")
        task = topic_classification(tok, workload.seq_len, 2 * workload.batch, 8)
        return model, task, task.batch(torch.arange(workload.batch))
    from rankwise.models.vision import RECIPES, pretrained_backbone, stand_in
    from rankwise.training.image_tasks import fashion_mnist_5to9

    recipe = RECIPES[workload.model]
    model = stand_in(recipe.architecture)[0] if smoke else pretrained_backbone(workload.model).module
    task = fashion_mnist_5to9(recipe.image_size, 2 * workload.batch, 8)
    return model, task, task.batch(torch.arange(workload.batch))


def measure(workload: Workload, arm: Arm, steps: int, smoke: bool = False) -> dict[str, Any]:
    """Build `arm` on `workload`, run one warm-up step (the optimizer's states exist from then on, as they do in
    training), then `steps` measured steps (peak RSS, step time), one step under the live-tensor count and one forward under
    the saved-tensor hooks. Returns one row of numbers (bytes and seconds)."""
    import torch

    from memory import live_tensor_peak, saved_tensor_bytes
    from rankwise.optim import optimizer_state_bytes

    torch.manual_seed(0)
    model, task, batch = _load(workload, smoke)
    baseline = _status("VmRSS")
    procedure = None
    if arm.kind == "lora":
        from rankwise.adapters import LoraConfig, add_adapter

        targets = arm.targets if isinstance(arm.targets, str) else list(arm.targets)
        model = add_adapter(model, LoraConfig(r=arm.rank, lora_alpha=2 * arm.rank, target_modules=targets))
    elif arm.kind in ("full", "procedure"):
        model.requires_grad_(True)
    else:
        raise ValueError(f"unknown arm kind {arm.kind!r}")
    module = task.wrap(model)
    module.train()
    if arm.train_only is not None:
        import re

        pattern = re.compile(arm.train_only)
        for name, p in model.named_parameters():
            p.requires_grad_(bool(pattern.search(name)))
    if arm.kind == "procedure":
        from rankwise.training.procedures import build_procedure

        procedure = build_procedure(arm.procedure, module, task, 0, **arm.options)
    trainable = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5)

    def loss_of() -> torch.Tensor:
        loss = task.loss(module, batch)
        extra = procedure.extra_loss(module) if procedure is not None else None
        return loss if extra is None else loss + extra

    def step(i: int) -> None:
        if procedure is not None:
            procedure.before_micro_batch(i, 0)
        loss_of().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if procedure is not None:
            procedure.after_step(i, module, task, batch)

    step(0)
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark of the resident set restarts from now
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        step(i)
    step_s = (time.perf_counter() - t0) / steps
    peak_rss = _status("VmHWM")

    live = [*module.parameters(), *module.buffers(), *_tensors(opt.state), *_tensors(batch)]
    if procedure is not None:
        live += _tensors(getattr(procedure, "__dict__", {}))
    peak, start, _ = live_tensor_peak(lambda: step(steps + 1), live)

    frozen = [*module.parameters(), *module.buffers()]
    if procedure is not None:
        procedure.before_micro_batch(steps + 2, 0)
    saved, loss = saved_tensor_bytes(loss_of, exclude=frozen)
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None)
    opt.zero_grad(set_to_none=True)
    analytic = procedure.analytic_memory(batch) if procedure is not None and hasattr(procedure, "analytic_memory") else {}
    return {"workload": workload.label, "arm": arm.label, "steps": steps, "step_s": step_s,
            "baseline_rss": baseline, "peak_rss": peak_rss, "training_rss": peak_rss - baseline,
            "tensor_peak": peak, "tensor_start": start, "saved_bytes": saved, "trainable_params": sum(p.numel() for p in trainable),
            "trainable_bytes": sum(p.numel() * p.element_size() for p in trainable), "grad_bytes": grads,
            "model_bytes": sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()]),
            "optimizer_bytes": optimizer_state_bytes(opt), "analytic": {k: int(v) for k, v in analytic.items()}}


def _tensors(obj: Any) -> list:
    """The tensors inside nested dicts, lists, tuples and plain objects' attributes (one level of objects)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def run_arms(jobs: list[tuple[Workload, list[Arm]]], steps: int, threads: int, smoke: bool = False) -> list[dict]:
    """Each (workload, arms) job's arms, each in a fresh process (a smoke run: everything in one process, whose
    numbers are not the benchmark: it checks the code path in seconds). Rows in the order given."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "RANKWISE_QUIET": "1", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": str(threads)}
    pairs = [(w, a) for w, arms in jobs for a in arms]
    groups = [pairs] if smoke else [[pair] for pair in pairs]
    rows: list[dict] = []
    for group in groups:
        spec = {"jobs": [[asdict(w), asdict(a)] for w, a in group], "steps": steps, "threads": threads, "smoke": smoke}
        done = subprocess.run([sys.executable, __file__, json.dumps(spec)], env=env, capture_output=True, text=True,
                              cwd=Path(__file__).parent)
        if done.returncode != 0:
            raise RuntimeError(f"measuring {[f'{w.label}: {a.label}' for w, a in group]} failed:\n{done.stderr[-4000:]}")
        for line in done.stdout.strip().splitlines()[-len(group):]:
            rows.append(json.loads(line))
            r = rows[-1]
            print(f"{r['workload']:>16} | {r['arm']:<28} training RSS {r['training_rss'] / MB:8.1f} MB, tensor peak "
                  f"{r['tensor_peak'] / MB:8.1f} MB, saved {r['saved_bytes'] / MB:7.1f} MB, {r['step_s']:.3f} s/step",
                  flush=True)
    return rows


def table(rows: list[dict]) -> list[str]:
    """Markdown rows per workload: measured memory (MB) and its ratio to the workload's first arm's, the analytic
    count."""
    lines = ["| workload | arm | trainable params | saved activations (MB) | / ref | tensor peak (MB) | / ref | "
             "above state (MB) | model (MB) | params+grads+Adam (MB) | training RSS (MB) | / ref | analytic (MB) | step s | / ref |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        group = [r for r in rows if r["workload"] == workload]
        ref = group[0]
        for r in group:
            analytic = ", ".join(f"{k} {v / MB:.1f}" for k, v in r["analytic"].items()
                                 if not k.endswith("_elements")) or "-"  # bytes only (counts of elements aside)
            state = r["trainable_bytes"] + r["grad_bytes"] + r["optimizer_bytes"]
            lines.append(
                f"| {workload} | {r['arm']} | {r['trainable_params']:,} | {r['saved_bytes'] / MB:.1f} | "
                f"{_ratio(r['saved_bytes'], ref['saved_bytes'])} | {r['tensor_peak'] / MB:.1f} | "
                f"{_ratio(r['tensor_peak'], ref['tensor_peak'])} | {(r['tensor_peak'] - r['tensor_start']) / MB:.1f} | "
                f"{r['model_bytes'] / MB:.1f} | {state / MB:.1f} | "
                f"{r['training_rss'] / MB:.1f} | {_ratio(r['training_rss'], ref['training_rss'])} | {analytic} | "
                f"{r['step_s']:.3f} | {_ratio(r['step_s'], ref['step_s'])} |")
    return lines


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def figure(rows: list[dict], title: str) -> bytes:
    """Bars per workload and arm: saved activations, tensor peak and training RSS (MB)."""
    from output import png_bytes, pyplot

    plt = pyplot()
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        group = [r for r in rows if r["workload"] == workload]
        xs = range(len(group))
        for offset, (key, label) in zip((-0.27, 0.0, 0.27), (("saved_bytes", "saved activations"),
                                                              ("tensor_peak", "tensor peak"),
                                                              ("training_rss", "training RSS"))):
            values = [r[key] / MB for r in group]
            ax.bar([x + offset for x in xs], values, width=0.27, label=label)
        ax.set_xticks(list(xs), [r["arm"] for r in group], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("MB")
        ax.set_title(workload)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return png_bytes(fig)


def machine_line(threads: int) -> str:
    import platform

    import torch

    return (f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, {threads} "
            f"thread{'s' if threads != 1 else ''}, nothing else running; torch {torch.__version__}.")


def benchmark_main(doc: str, slug: str, title: str, workloads: list[Workload], arms: dict[str, list[Arm]],
                   notes: list[str], argv: list[str] | None = None, smoke_workloads: list[Workload] | None = None) -> None:
    """The command line of a training-memory benchmark: `arms[workload.label]` on each workload, a table with ratios
    to the first arm ("full FT"), a figure, and `notes` (what to read, the goals) under the title."""
    from common import benchmark_parser, parse_benchmark_args
    from output import write_benchmark

    parser = benchmark_parser(doc, slug)
    parser.add_argument("--steps", type=int, default=2, help="measured steps per arm, after a warm-up step "
                        "(default: %(default)s)")
    args = parse_benchmark_args(parser, argv, {"steps": 1})
    chosen = smoke_workloads if args.smoke and smoke_workloads else workloads
    t0 = time.perf_counter()
    rows = run_arms([(w, arms[w.label]) for w in chosen], args.steps, args.threads or 1, smoke=args.smoke)
    lines = [f"# {title}", "", *notes, "",
             machine_line(args.threads or 1) + f" {args.steps} measured steps per arm; the whole benchmark took "
             f"{time.perf_counter() - t0:.0f} s.", "", *table(rows), "",
             "Columns: *saved activations* — what autograd keeps for the backward (parameters and buffers excluded); "
             "*tensor peak* — the most tensor bytes alive at once during a step (weights, optimizer states and batch "
             "included), *above state* the same minus what was alive before the step; *model* — every parameter and "
             "buffer of the model as trained (a factored layer's factors, not its dense weight); *params+grads+Adam* — the "
             "trainable parameters, their gradients and AdamW's two moments; *training RSS* — the process's peak "
             "resident memory over the measured steps minus its resident memory with the model and batch loaded "
             "(allocator and interpreter overheads included); *analytic* — the method's own count "
             "(`procedure.analytic_memory`); ratios (/ ref) are to the first arm of the workload.", "",
             "![memory per arm](benchmark.png)"]
    write_benchmark(args.out, lines, figure(rows, title), smoke=args.smoke)


def _child(spec: dict) -> None:
    from rankwise.core.threads import limit_threads

    with limit_threads(spec["threads"]):
        for workload, arm in spec["jobs"]:
            targets = arm["targets"] if isinstance(arm["targets"], str) else tuple(arm["targets"])
            arm = Arm(**{**arm, "targets": targets})
            print(json.dumps(measure(Workload(**workload), arm, spec["steps"], spec["smoke"])), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    _child(json.loads(sys.argv[1]))
