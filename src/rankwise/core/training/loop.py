"""The training loop: AdamW (or any optimizer from a factory, see `optimizer`) with warmup + cosine (to a floor),
gradient accumulation, gradient clipping, periodic evaluation, tokens seen, checkpoints every N steps with exact
resume, a progress bar, a NaN guard, and data parallelism under torchrun (see `distributed`).

Batches are a pure function of (seed, micro-batch index): an endless stream of per-epoch permutations of the
training set, so a resumed run sees exactly the batches the uninterrupted run would have seen. The learning rate
is a pure function of the step. Together with the saved parameters, AdamW moments and RNG state, resuming from a
checkpoint reproduces the uninterrupted run bit for bit.

Under DDP every rank draws the same global micro-batch and trains on its own contiguous slice of it (the global
batch size is `config.batch_size` whatever the number of ranks); losses, token counts and evaluations are reduced
over ranks, and only rank 0 writes checkpoints while the others wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.core.progress import progress, say
from rankwise.core.training import distributed
from rankwise.core.training.checkpoint import load_checkpoint, save_checkpoint, trainable
from rankwise.core.training.contracts import Task, TrainConfig, TrainResult, count_tokens
from rankwise.core.training.guard import check_covers, grad_norm, nonfinite_error
from rankwise.core.training.optimizer import OptimizerFactory, adamw, optimizer_label
from rankwise.core.training.precision import autocast_context
from rankwise.core.training.procedure import Procedure
from rankwise.core.training.schedule import lr_at
from rankwise.errors import InvalidInputError, NumericalError


def batch_indices(micro_batch: int, batch_size: int, num_train: int, seed: int) -> torch.Tensor:
    """Indices of micro-batch k: positions [k*B, (k+1)*B) of the concatenated per-epoch permutations."""
    start = micro_batch * batch_size
    out = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), num_train)
        perm = torch.randperm(num_train, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.extend(perm[offset : offset + batch_size - len(out)].tolist())
    return torch.tensor(out)


def train(
    module: nn.Module,
    task: Task,
    config: TrainConfig,
    out_dir: str | Path | None = None,
    resume: bool = True,
    optimizer: OptimizerFactory | None = None,
    stop_after: int | None = None,
    find_unused_parameters: bool | None = None,
    run_config: Mapping[str, Any] | None = None,
    procedure: Procedure | None = None,
) -> TrainResult:
    """Train the trainable parameters of `module` on `task`; returns losses and evaluations.

    `optimizer` builds the optimizer from (module, config) — default `optimizers.adamw()`; it must cover every
    trainable parameter. With `out_dir` and `config.checkpoint_every`, a checkpoint is written to
    `out_dir/checkpoint` every N steps and, if `resume`, an existing one is continued exactly. A NaN or infinite loss
    or gradient stops training with a NumericalError; the last good checkpoint stays on disk.

    `stop_after` ends this call once that many steps (in total, counting resumed ones) are done: a run trained in
    slices. The schedule still spans `config.steps`; a checkpoint is written at the stop (with `out_dir`), and the
    final evaluation is skipped until the last slice.

    `run_config` describes what `module` and `task` were built from (model, method and its options, data selection,
    sequence length, ... — JSON values by field name): the checkpoint records it with the training settings and the
    task's size, and a resume whose configuration differs in any field is refused, naming the field.

    `procedure` (see `procedures`) hooks a method's changes into the loop: before each micro-batch, an extra loss
    term, after each optimizer step, at the end. Its `describe()` is recorded like `run_config`.

    Under torchrun (or with torch.distributed initialised) the module is trained data-parallel: see the module
    docstring and `distributed`. `find_unused_parameters` goes to DistributedDataParallel; None (the default) sets it
    only when the first batch leaves a trainable parameter without a gradient on some rank (e.g. BERT's pooler under
    a classification head). Pass True for a module whose use of parameters changes from batch to batch.
    """
    config.validate()
    procedure = procedure or Procedure()
    if procedure.runs_on != "loop":
        raise InvalidInputError(f"training procedure {procedure.name!r} runs on the {procedure.runs_on!r} runner, not in "
                                "this loop: run it with rankwise.training.procedures.run_procedure")
    if not procedure.resumable and config.checkpoint_every and out_dir is not None:
        raise InvalidInputError(f"training procedure {procedure.name!r} keeps state a checkpoint cannot store: "
                                "pass checkpoint_every=0 (no checkpoints, no resume)")
    if stop_after is not None and stop_after < 1:
        raise InvalidInputError(f"stop_after must be at least 1, got {stop_after}")
    distributed.init_distributed()
    world, rank = distributed.world_size(), distributed.rank()
    if config.batch_size % world:
        raise InvalidInputError(
            f"batch_size {config.batch_size} must be a multiple of the {world} ranks (each takes an equal slice of the "
            "global batch, so the update equals the single-process one)"
        )
    named = trainable(module)
    params = list(named.values())
    if not params:
        raise InvalidInputError("the module has no trainable parameters: add an adapter (or unfreeze something) first")
    factory = optimizer or adamw()
    opt = factory(module, config)
    check_covers(opt, named)
    # Each group follows the schedule at its own learning rate relative to config.lr (read before any resume).
    lr_scale = [group["lr"] / config.lr for group in opt.param_groups]
    ckpt = Path(out_dir) / "checkpoint" if out_dir is not None else None
    run = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("eval_every", "checkpoint_every")}
    if run["decay"] == "cosine":
        del run["decay"]  # the default, recorded only when another: checkpoints written before it existed still resume
    if run["autocast"] is None:
        del run["autocast"]  # likewise
    run["task"] = task.name
    run["num_train"] = task.num_train  # another data selection is another run
    run["optimizer"] = optimizer_label(factory)  # resuming with another optimizer is refused
    clash = sorted(set(run) & set(run_config or {}))
    if clash:
        raise InvalidInputError(f"run_config may not redefine the training settings {clash}: they are recorded from config and task")
    run.update(run_config or {})
    if procedure.name != Procedure.name:
        run.update(procedure.describe())
    run = json.loads(json.dumps(run, default=str))  # as trainer.json will hold it (tuples as lists), to compare alike
    result = TrainResult(steps=0, final={}, optimizer=opt, world_size=world)
    start_step = 0
    if ckpt is not None and resume and (ckpt / "trainer.json").is_file():
        saved_state: dict[str, torch.Tensor] = {}
        meta = load_checkpoint(ckpt, module, opt, run, extra=saved_state)
        procedure.load_state_tensors(saved_state)
        start_step = int(meta["step"])
        result.history, result.evals, result.resumed_from = list(meta.get("history", [])), list(meta.get("evals", [])), start_step
        say(f"resuming {task.name} from the checkpoint at step {start_step} in {ckpt}")

    share = slice(rank * config.batch_size // world, (rank + 1) * config.batch_size // world)
    ddp = None
    if world > 1:
        if find_unused_parameters is None:
            first = task.batch(batch_indices(start_step * config.grad_accum, config.batch_size, task.num_train, config.seed)[share])
            unused = _unused_parameters(module, task, first, named)
            find_unused_parameters = bool(distributed.all_reduce_sum(torch.tensor([float(len(unused))])) > 0)
        ddp = _wrap_ddp(module, find_unused_parameters)
    model = ddp if ddp is not None else module  # what the loss is computed with (the DDP wrapper syncs gradients)
    tokens = int(result.history[-1].get("tokens", 0)) if result.history else 0

    t0 = time.perf_counter()
    model.train()
    end = config.steps if stop_after is None else min(config.steps, max(stop_after, start_step))
    steps = range(start_step, end)
    bar = progress(steps, desc=f"train {task.name}", total=config.steps, initial=start_step) if distributed.is_main_process() else _NoBar(steps)
    for step in bar:
        lr = lr_at(step, config.steps, config.lr, config.warmup_steps, config.min_lr_ratio, config.decay)
        for group, scale in zip(opt.param_groups, lr_scale):
            group["lr"] = lr * scale
        # [sum of micro-batch losses / grad_accum, tokens, non-finite losses]: reduced over ranks in one call
        stats, bad = torch.zeros(3, dtype=torch.float64), None
        for micro in range(config.grad_accum):
            indices = batch_indices(step * config.grad_accum + micro, config.batch_size, task.num_train, config.seed)
            batch = task.batch(indices[share])
            # Gradients are all-reduced once per optimizer step, on the last micro-batch.
            sync = ddp.no_sync() if ddp is not None and micro < config.grad_accum - 1 else contextlib.nullcontext()
            procedure.before_micro_batch(step, micro)
            with sync:
                with autocast_context(config.autocast, module):
                    loss = task.loss(model, batch)
                    extra = procedure.extra_loss(module)
                    if extra is not None:
                        loss = loss + extra
                # Backward even through a non-finite loss: under DDP every rank must join the gradient all-reduce;
                # the step is refused below, before the optimizer sees anything.
                (loss / config.grad_accum).backward()
            value = float(loss.detach())
            finite = math.isfinite(value)
            bad = bad if finite or bad is not None else value
            stats += torch.tensor([value / config.grad_accum if finite else 0.0, _batch_tokens(task, batch), 0.0 if finite else 1.0],
                                  dtype=torch.float64)
        stats = distributed.all_reduce_sum(stats)
        total, tokens = float(stats[0]) / world, tokens + int(stats[1])
        if stats[2] > 0:
            opt.zero_grad(set_to_none=True)
            what = bad if bad is not None else "non-finite on another rank"
            _stop(f"the loss became {what} at step {step + 1}", ckpt, result, before_any_update=step == start_step == 0)
        norm = grad_norm(params, config.max_grad_norm)
        if not math.isfinite(norm):
            _stop(f"the gradient norm became {norm} at step {step + 1}", ckpt, result)
        opt.step()
        opt.zero_grad(set_to_none=True)
        procedure.after_step(step, module, task, batch)
        result.history.append({"step": step + 1, "loss": total, "lr": lr, "grad_norm": norm, "tokens": tokens})
        bar.set_postfix(loss=f"{total:.4f}")
        done = step + 1
        if config.eval_every and done % config.eval_every == 0 and done < config.steps:
            result.evals.append({"step": done, **_evaluate(task, module)})
            model.train()
        periodic = bool(config.checkpoint_every) and done % config.checkpoint_every == 0
        if ckpt is not None and (periodic or done == end < config.steps):
            if distributed.is_main_process():
                save_checkpoint(ckpt, module, opt, done, {"run": run, "history": result.history, "evals": result.evals},
                                extra=procedure.state_tensors())
            distributed.barrier()  # the other ranks wait until the checkpoint is complete on disk
    module.eval()
    if end == config.steps:
        procedure.end_of_training(module)
    for group, scale in zip(opt.param_groups, lr_scale):  # leave the optimizer at its peak learning rates
        group["lr"] = config.lr * scale
    result.steps = end
    if end == config.steps:
        result.final = _evaluate(task, module)
        result.evals.append({"step": config.steps, **result.final})
    result.wall_s = time.perf_counter() - t0
    return result


class _NoBar:
    """Ranks other than 0 draw no progress bar."""

    def __init__(self, steps: range) -> None:
        self.steps = steps

    def __iter__(self):
        return iter(self.steps)

    def set_postfix(self, **_: Any) -> None:
        pass


def _wrap_ddp(module: nn.Module, find_unused_parameters: bool) -> nn.Module:
    """DistributedDataParallel over the trainable parameters only: frozen ones (an adapter's base model) are neither
    broadcast nor all-reduced, so they are checked to be equal on every rank instead."""
    from torch.nn.parallel import DistributedDataParallel

    frozen = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
    distributed.check_same_across_ranks([p for _, p in frozen], "frozen parameters")
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, [n for n, _ in frozen])
    try:
        # Constructing DDP broadcasts rank 0's trainable parameters (equal already when every rank seeded alike).
        return DistributedDataParallel(module, find_unused_parameters=find_unused_parameters)
    finally:  # DDP reads the ignore list only here: leave the user's module as it was
        del module._ddp_params_and_buffers_to_ignore


def _unused_parameters(module: nn.Module, task: Task, batch: dict[str, torch.Tensor], named: dict[str, nn.Parameter]) -> list[str]:
    """Trainable parameters the loss of `batch` does not reach (walking its autograd graph; no backward is run).

    The probe leaves no trace: the RNG (dropout) and the buffers (running statistics) are restored afterwards.
    """
    rng = torch.get_rng_state()
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    try:
        module.train()
        loss = task.loss(module, batch)
        reached, seen, stack = set(), set(), [loss.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            variable = getattr(fn, "variable", None)  # AccumulateGrad: the leaf (parameter) it accumulates into
            if variable is not None:
                reached.add(id(variable))
            stack.extend(f for f, _ in fn.next_functions)
        del loss
    finally:
        torch.set_rng_state(rng)
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(buffers[n])
    return [n for n, p in named.items() if id(p) not in reached]


def _batch_tokens(task: Task, batch: dict[str, torch.Tensor]) -> int:
    counter = getattr(task, "batch_tokens", None)
    return int(counter(batch)) if counter is not None else count_tokens(batch)


def _evaluate(task: Task, module: nn.Module) -> dict[str, float]:
    """The task's evaluation; under DDP each rank evaluates and the metrics are averaged over ranks."""
    return distributed.average_metrics(task.evaluate(module))


def _stop(what: str, ckpt: Path | None, result: TrainResult, before_any_update: bool = False) -> None:
    if before_any_update:  # the model as built already gives a non-finite loss: no rate or clipping can help
        raise NumericalError(f"training stopped: {what}, before any update, so the learning rate is not the cause: the "
                             "model as built gives a non-finite loss (check the method's options, e.g. a huge scaling, "
                             "the model's weights, or the inputs)")
    # Resuming repeats the same steps (a changed --lr is refused as another run): the advice is to start afresh.
    kept = (
        f"the last good checkpoint is kept in {ckpt}, but resuming it would repeat the same steps: start afresh "
        "(--no-resume, or another output folder)"
        if ckpt is not None and (ckpt / "trainer.json").is_file()
        else "no checkpoint was written yet"
    )
    raise nonfinite_error("training", what, result.history[-1]["loss"] if result.history else None, kept)


def summary(result: TrainResult) -> dict[str, Any]:
    """A JSON-friendly summary of a run."""
    return {"steps": result.steps, "final": result.final, "evals": result.evals, "wall_s": result.wall_s,
            "resumed_from": result.resumed_from, "tokens_seen": result.tokens_seen, "world_size": result.world_size,
            "history": result.history}
