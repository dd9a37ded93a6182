"""The fine-tuning loop: AdamW (or any optimizer from a factory, see `optimizers`) with warmup + cosine, gradient
accumulation, gradient clipping, periodic evaluation, checkpoints every N steps with exact resume, a progress bar
and a NaN guard.

Batches are a pure function of (seed, micro-batch index): an endless stream of per-epoch permutations of the
training set, so a resumed run sees exactly the batches the uninterrupted run would have seen. The learning rate
is a pure function of the step. Together with the saved parameters, AdamW moments and RNG state, resuming from a
checkpoint reproduces the uninterrupted run bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rankwise.core.progress import progress, say
from rankwise.errors import InvalidInputError, NumericalError
from rankwise.training.checkpoint import load_checkpoint, save_checkpoint, trainable
from rankwise.training.optimizers import OptimizerFactory, adamw, optimizer_label
from rankwise.training.schedule import lr_at


class Task(Protocol):
    name: str
    metric: str
    higher_is_better: bool

    @property
    def num_train(self) -> int: ...
    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]: ...
    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor: ...
    def evaluate(self, module: nn.Module) -> dict[str, float]: ...


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps
    batch_size: int = 16  # examples per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_ratio: float = 0.1  # fraction of steps with linear warmup
    min_lr_ratio: float = 0.0  # cosine floor, as a fraction of lr
    max_grad_norm: float | None = 1.0  # None: no clipping
    eval_every: int = 0  # 0: evaluate only at the end
    checkpoint_every: int = 0  # 0: no checkpoints
    seed: int = 0

    def validate(self) -> None:
        for name in ("steps", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InvalidInputError(f"lr must be a positive number, got {self.lr}")
        if self.eval_every < 0 or self.checkpoint_every < 0:
            raise InvalidInputError("eval_every and checkpoint_every must be >= 0 (0 disables them)")

    @property
    def warmup_steps(self) -> int:
        return int(round(self.warmup_ratio * self.steps))


@dataclass
class TrainResult:
    steps: int  # steps done when this call returned (config.steps unless stopped early)
    final: dict[str, float]  # evaluation after the last step (empty when stopped early)
    history: list[dict[str, float]] = field(default_factory=list)  # per step: step, loss, lr, grad_norm
    evals: list[dict[str, float]] = field(default_factory=list)  # periodic evaluations with their step
    wall_s: float = 0.0
    resumed_from: int | None = None
    optimizer: torch.optim.Optimizer | None = None  # the optimizer used, with its final state (not in summary())

    @property
    def losses(self) -> list[float]:
        return [h["loss"] for h in self.history]


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
) -> TrainResult:
    """Train the trainable parameters of `module` on `task`; returns losses and evaluations.

    `optimizer` builds the optimizer from (module, config) — default `optimizers.adamw()`; it must cover every
    trainable parameter. With `out_dir` and `config.checkpoint_every`, a checkpoint is written to
    `out_dir/checkpoint` every N steps and, if `resume`, an existing one is continued exactly. A NaN or infinite loss
    or gradient stops training with a NumericalError; the last good checkpoint stays on disk.

    `stop_after` ends this call once that many steps (in total, counting resumed ones) are done: a run trained in
    slices. The schedule still spans `config.steps`; a checkpoint is written at the stop (with `out_dir`), and the
    final evaluation is skipped until the last slice.
    """
    config.validate()
    if stop_after is not None and stop_after < 1:
        raise InvalidInputError(f"stop_after must be at least 1, got {stop_after}")
    named = trainable(module)
    params = list(named.values())
    if not params:
        raise InvalidInputError("the module has no trainable parameters: add an adapter (or unfreeze something) first")
    factory = optimizer or adamw()
    opt = factory(module, config)
    _check_covers(opt, named)
    # Each group follows the schedule at its own learning rate relative to config.lr (read before any resume).
    lr_scale = [group["lr"] / config.lr for group in opt.param_groups]
    ckpt = Path(out_dir) / "checkpoint" if out_dir is not None else None
    run = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("eval_every", "checkpoint_every")}
    run["task"] = task.name
    run["optimizer"] = optimizer_label(factory)  # resuming with another optimizer is refused
    result = TrainResult(steps=0, final={}, optimizer=opt)
    start_step = 0
    if ckpt is not None and resume and (ckpt / "trainer.json").is_file():
        meta = load_checkpoint(ckpt, module, opt, run)
        start_step = int(meta["step"])
        result.history, result.evals, result.resumed_from = list(meta.get("history", [])), list(meta.get("evals", [])), start_step
        say(f"resuming {task.name} from the checkpoint at step {start_step} in {ckpt}")

    t0 = time.perf_counter()
    module.train()
    end = config.steps if stop_after is None else min(config.steps, max(stop_after, start_step))
    bar = progress(range(start_step, end), desc=f"train {task.name}", total=config.steps, initial=start_step)
    for step in bar:
        lr = lr_at(step, config.steps, config.lr, config.warmup_steps, config.min_lr_ratio)
        for group, scale in zip(opt.param_groups, lr_scale):
            group["lr"] = lr * scale
        total = 0.0
        for micro in range(config.grad_accum):
            batch = task.batch(batch_indices(step * config.grad_accum + micro, config.batch_size, task.num_train, config.seed))
            loss = task.loss(module, batch)
            if not torch.isfinite(loss):
                _stop(f"the loss became {float(loss.detach())} at step {step + 1}", ckpt, result)
            (loss / config.grad_accum).backward()
            total += float(loss.detach()) / config.grad_accum
        norm = _grad_norm(params, config.max_grad_norm)
        if not math.isfinite(norm):
            _stop(f"the gradient norm became {norm} at step {step + 1}", ckpt, result)
        opt.step()
        opt.zero_grad(set_to_none=True)
        result.history.append({"step": step + 1, "loss": total, "lr": lr, "grad_norm": norm})
        bar.set_postfix(loss=f"{total:.4f}")
        done = step + 1
        if config.eval_every and done % config.eval_every == 0 and done < config.steps:
            result.evals.append({"step": done, **task.evaluate(module)})
            module.train()
        periodic = bool(config.checkpoint_every) and done % config.checkpoint_every == 0
        if ckpt is not None and (periodic or done == end < config.steps):
            save_checkpoint(ckpt, module, opt, done, {"run": run, "history": result.history, "evals": result.evals})
    module.eval()
    result.steps = end
    if end == config.steps:
        result.final = task.evaluate(module)
        result.evals.append({"step": config.steps, **result.final})
    result.wall_s = time.perf_counter() - t0
    return result


def _check_covers(opt: torch.optim.Optimizer, params: dict[str, nn.Parameter]) -> None:
    covered = {id(p) for group in opt.param_groups for p in group["params"]}
    missing = [n for n, p in params.items() if id(p) not in covered]
    if missing:
        raise InvalidInputError(
            f"the optimizer does not update {len(missing)} trainable parameter(s), e.g. {missing[:3]}: its factory must "
            "cover every parameter with requires_grad (freeze the others first)"
        )


def _grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm is None:
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in grads])))
    return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))


def _stop(what: str, ckpt: Path | None, result: TrainResult) -> None:
    kept = (
        f"the last good checkpoint is kept in {ckpt} (resume from it with a lower learning rate)"
        if ckpt is not None and (ckpt / "trainer.json").is_file()
        else "no checkpoint was written yet"
    )
    last = f"; the last finite loss was {result.history[-1]['loss']:.4g}" if result.history else ""
    raise NumericalError(f"training stopped: {what}{last}; {kept}. Try a lower learning rate or gradient clipping.")


def summary(result: TrainResult) -> dict[str, Any]:
    """A JSON-friendly summary of a run."""
    return {"steps": result.steps, "final": result.final, "evals": result.evals, "wall_s": result.wall_s,
            "resumed_from": result.resumed_from, "history": result.history}
