"""Saving and loading a fitted Lorsa: `lorsa.safetensors` (state dict) + `lorsa.json` (shape and provenance).

The folder is written atomically with a manifest (`core.io.save_model_folder`) and verified before loading; no
pickles. `source` records where the activations came from (model name, layer, hook points, data), so tools such as
`rankwise lorsa top` can recompute the head activations on fresh text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from rankwise.core.io import (
    load_tensors,
    read_versioned_config,
    save_model_folder,
    save_tensors_atomic,
    verify_manifest,
    write_versioned_config,
)
from rankwise.core.json_fields import json_field
from rankwise.errors import CorruptFileError, InvalidInputError
from rankwise.nn.lorsa.config import LorsaConfig
from rankwise.nn.lorsa.layer import Lorsa

FORMAT = "lorsa"
VERSION = 1
CONFIG_FILE, WEIGHTS_FILE = "lorsa.json", "lorsa.safetensors"


def save_lorsa(lorsa: Lorsa, path: str | os.PathLike, source: dict[str, Any] | None = None) -> Path:
    """Write `lorsa` (and JSON-serialisable `source` metadata) to the folder `path`; returns the path."""
    if not isinstance(lorsa, Lorsa):
        raise InvalidInputError(f"save_lorsa takes a Lorsa, got {type(lorsa).__name__}")
    state = {k: v.detach().cpu() for k, v in lorsa.state_dict().items()}

    def write(tmp: Path) -> None:
        save_tensors_atomic(tmp / WEIGHTS_FILE, state)
        write_versioned_config(tmp / CONFIG_FILE, FORMAT, VERSION,
                               {"config": lorsa.config.to_dict(), "dtype": str(lorsa.W_O.dtype).removeprefix("torch."),
                                "source": source or {}})

    return save_model_folder(path, write, format_name=FORMAT)


def load_lorsa(path: str | os.PathLike) -> tuple[Lorsa, dict[str, Any]]:
    """(the Lorsa in eval mode, its `source` metadata) from a folder `save_lorsa` wrote; checks sizes and hashes."""
    path = Path(path)
    if not path.is_dir():
        raise CorruptFileError(f"{path} is not a folder written by save_lorsa")
    if not (path / CONFIG_FILE).is_file():  # another kind of folder (a model, a run): say what was expected
        raise InvalidInputError(f"{path} is not a fitted Lorsa folder (no {CONFIG_FILE}): pass the folder that "
                                "`rankwise repro lorsa` or `rankwise.nn.lorsa.save_lorsa` wrote")
    verify_manifest(path)
    meta = read_versioned_config(path / CONFIG_FILE, FORMAT, VERSION)
    lorsa = Lorsa(LorsaConfig.from_dict(json_field(meta, "config", dict, path / CONFIG_FILE, required=True)))
    source = json_field(meta, "source", dict, path / CONFIG_FILE, {})  # checked before the weights load
    dtype = getattr(torch, str(meta.get("dtype", "float32")), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptFileError(f"{path / CONFIG_FILE} names an unknown dtype {meta.get('dtype')!r}")
    lorsa = lorsa.to(dtype)
    try:
        lorsa.load_state_dict(load_tensors(path / WEIGHTS_FILE))
    except RuntimeError as e:
        raise CorruptFileError(f"{path / WEIGHTS_FILE} does not match the config in {CONFIG_FILE} ({e})") from e
    return lorsa.eval(), dict(source)
