"""Training checkpoints: everything an exact resume needs, in safetensors + versioned JSON, written atomically.

A checkpoint folder holds `state.safetensors` (trainable parameters by name, the optimizer's per-parameter state —
AdamW moments, LoRA-Pre factors — and torch's RNG state for dropout) and `trainer.json` (step, history, the run's full
configuration — training settings, task size, and what the caller built the model and data from — and each
parameter group's hyperparameters),
with a manifest of hashes. Writing goes to a temporary folder renamed into place, so the folder on disk is always
the last complete checkpoint — which is what a run that dies (or hits a NaN loss) leaves behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.core.io import load_tensors, read_versioned_config, save_model_folder, save_tensors_atomic, verify_manifest, write_versioned_config
from rankwise.core.json_fields import json_field
from rankwise.errors import CorruptFileError, InvalidInputError

KIND = "rankwise-train-checkpoint"
VERSION = 1


def trainable(module: nn.Module) -> dict[str, nn.Parameter]:
    """Trainable parameters by name (shared parameters once), in a stable order."""
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


def save_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, step: int, meta: dict[str, Any],
                    extra: dict[str, torch.Tensor] | None = None) -> None:
    """`extra`: a training procedure's own tensors (`Procedure.state_tensors`), stored as `procedure/<key>`."""
    params = trainable(module)
    index = _param_index(optimizer)
    tensors: dict[str, torch.Tensor] = {f"param/{n}": p.detach() for n, p in params.items()}
    for n, p in params.items():
        if id(p) not in index:
            raise InvalidInputError(f"trainable parameter {n} is not in the optimizer: the checkpoint would be incomplete")
        for k, v in optimizer.state.get(p, {}).items():
            if torch.is_tensor(v):
                tensors[f"optim/{n}/{k}"] = v.detach()
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                tensors[f"optim/{n}/{k}"] = torch.tensor(v)
            else:
                raise InvalidInputError(
                    f"{type(optimizer).__name__} keeps a {type(v).__name__} in its state ({n}: {k!r}), which a checkpoint "
                    "cannot store as tensors; train without checkpoints (checkpoint_every=0) or with another optimizer"
                )
    tensors["rng/torch"] = torch.get_rng_state()
    tensors.update({f"procedure/{k}": v.detach() for k, v in (extra or {}).items()})
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]

    def write(tmp: Path) -> None:
        save_tensors_atomic(tmp / "state.safetensors", tensors)
        write_versioned_config(tmp / "trainer.json", KIND, VERSION, {"step": step, "optimizer": hyper, **meta})

    save_model_folder(folder, write, kind=KIND)


def load_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, expected_run: dict[str, Any],
                    extra: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """Restore parameters, optimizer state and RNG from `folder`; return its trainer.json fields. A dict passed as
    `extra` receives the procedure tensors saved with it (keys without the `procedure/` prefix).

    Raises CorruptFileError for a damaged checkpoint and InvalidInputError when it belongs to a different run
    (other parameters, or other settings that would change the result).
    """
    verify_manifest(folder)
    meta = read_versioned_config(folder / "trainer.json", KIND, VERSION)
    check_meta(folder / "trainer.json", meta)
    check_same_run(folder, meta.get("run") or {}, expected_run)
    tensors = load_tensors(folder / "state.safetensors")
    rng = tensors.get("rng/torch")
    # What torch.get_rng_state() wrote, checked before any parameter is overwritten.
    if rng is None or rng.dtype != torch.uint8 or rng.shape != torch.get_rng_state().shape:
        raise CorruptFileError(f"{folder / 'state.safetensors'} holds no valid RNG state (rng/torch: "
                               f"{'missing' if rng is None else f'{rng.dtype}, shape {tuple(rng.shape)}'}); delete the "
                               "checkpoint folder to start over")
    params = trainable(module)
    saved = {k[len("param/") :] for k in tensors if k.startswith("param/")}
    if saved != set(params):
        raise InvalidInputError(
            f"the checkpoint in {folder} holds parameters {sorted(saved - set(params))[:3]} missing here and lacks "
            f"{sorted(set(params) - saved)[:3]}: it was written for a different model or method"
        )
    with torch.no_grad():
        for n, p in params.items():
            value = tensors[f"param/{n}"]
            if value.shape != p.shape:
                raise InvalidInputError(f"checkpoint parameter {n} has shape {tuple(value.shape)}, the model's is {tuple(p.shape)}")
            p.copy_(value)
    state = optimizer.state_dict()
    order = _param_index(optimizer)
    restored: dict[int, dict[str, torch.Tensor]] = {}
    for n, p in params.items():
        prefix = f"optim/{n}/"
        entries = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        if entries:
            check_moment_shapes(folder, n, p, entries)
            # Fresh (64-byte aligned) copies: BLAS may round differently on tensors viewed at odd offsets of the
            # file buffer, which would break bit-exact resume of optimizers that multiply their state (LoRA-Pre).
            restored[order[id(p)]] = {k: v.clone() for k, v in entries.items()}
    state["state"] = restored
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as e:
        raise CorruptFileError(f"the optimizer state in {folder} cannot be restored ({e})") from e
    try:
        torch.set_rng_state(rng)
    except (RuntimeError, TypeError) as e:  # e.g. a state of the wrong size for this torch's generator
        raise CorruptFileError(f"the RNG state in {folder / 'state.safetensors'} cannot be restored ({e}); delete the "
                               "checkpoint folder to start over") from e
    if extra is not None:
        extra.update({k[len("procedure/") :]: v.clone() for k, v in tensors.items() if k.startswith("procedure/")})
    return meta


def check_meta(path: Path, meta: dict[str, Any]) -> None:
    """trainer.json's fields the loop reads on resume, typed: the step it resumes from (an integer, 0 <= step <=
    the run's steps), the history and evaluations (lists of records) and the run's settings (an object). A crafted
    or hand-edited file is refused by name, not resumed from a wrong step."""
    step = json_field(meta, "step", int, path, required=True)
    run = json_field(meta, "run", dict, path, {})
    steps = run.get("steps")
    if step < 0 or (type(steps) is int and step > steps):
        raise CorruptFileError(f"{path}: step {step} is outside the run's 0..{steps if type(steps) is int else '?'} steps: "
                               "the file was edited; delete the checkpoint folder to start over")
    for key in ("history", "evals"):
        records = json_field(meta, key, list, path, [])
        if not all(isinstance(r, dict) for r in records):
            raise CorruptFileError(f"{path}: field {key!r} must be a list of JSON objects (one per step or evaluation): "
                                   "the file was edited; delete the checkpoint folder to start over")


# Per-parameter moments of torch's optimizers: the parameter's own shape (LoRA-Pre's factors are shaped otherwise).
_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")


def check_moment_shapes(folder: Path, name: str, param: torch.Tensor, entries: dict[str, torch.Tensor]) -> None:
    """Refuse a saved moment whose shape is not its parameter's: torch would accept it and fail (or broadcast) at the
    first optimizer step, after the resume was reported."""
    for key, value in entries.items():
        if key in _MOMENTS and value.shape != param.shape:
            raise CorruptFileError(f"the optimizer state {key} of {name} in {folder} has shape {tuple(value.shape)}, the "
                                   f"parameter {tuple(param.shape)}: the checkpoint is damaged; delete it to start over")


_MISSING = object()


def check_same_run(folder: Path, saved: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse to resume unless the checkpoint's run configuration equals this run's in every field (both ways)."""
    differs = []
    for key in sorted(set(saved) | set(expected)):
        old, new = saved.get(key, _MISSING), expected.get(key, _MISSING)
        if old == new:
            continue
        if old is _MISSING:
            differs.append(f"{key} (not recorded in the checkpoint, which an older rankwise wrote; now {new!r})")
        elif new is _MISSING:
            differs.append(f"{key} (checkpoint {old!r}, not set by this run)")
        else:
            differs.append(f"{key} (checkpoint {old!r}, now {new!r})")
    if differs:
        raise InvalidInputError(
            f"the checkpoint in {folder} was written by a run with different settings: {'; '.join(differs)}. Resuming it would "
            "train a different model: rerun with the checkpoint's settings, or start afresh with --no-resume "
            "(resume=False) or another output folder"
        )


def _param_index(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """Parameter id -> its index in `optimizer.state_dict()` (torch numbers parameters across groups in order)."""
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    return {id(p): i for i, p in enumerate(flat)}
