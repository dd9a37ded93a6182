"""The one experiment set-up of reproductions: per-size settings and the model picker.

    @dataclass(frozen=True)
    class Settings:            # an experiment's knobs, one field each
        steps: int
        seeds: int

    SIZES = BySize(smoke=Settings(steps=4, seeds=1), full=Settings(steps=400, seeds=5))
    s = SIZES[size]            # a clear error for anything but "smoke" / "full"

    model, tokenizer = experiment_model("minilm-l6", size, seed)   # smoke: a tiny random model of the same family

The thread policy is the runner's (`rankwise.repro.run_reproduction`, from the registry's `Experiment.threads`), not
an experiment's own business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rankwise.core.report import SIZES as SIZE_NAMES
from rankwise.errors import InvalidInputError, UnknownNameError

S = TypeVar("S")


@dataclass(frozen=True)
class BySize(Generic[S]):
    """An experiment's settings at each reproduction size: `smoke` (seconds, tiny models) and `full` (the evidence)."""

    smoke: S
    full: S

    def __getitem__(self, size: str) -> S:
        if size not in SIZE_NAMES:
            raise InvalidInputError(f"size must be one of {SIZE_NAMES}, got {size!r}")
        return getattr(self, size)


def experiment_model(name: str, size: str, seed: int = 0, **smoke_shape: Any) -> tuple[Any, Any]:
    """(model, tokenizer) for an experiment: the embedded model at `full`, a tiny random one of its family at `smoke`.

    The tokenizer is always the real one, so smoke runs exercise the same data path. `smoke_shape` overrides the
    tiny model's shape (e.g. `num_layers=3`), and is ignored at `full`. Both come from the model's record
    (`rankwise.models.embedded`).
    """
    from rankwise.models import load_model
    from rankwise.models.embedded import EMBEDDED_MODELS
    from rankwise.registry import resolve

    if name not in EMBEDDED_MODELS:
        raise UnknownNameError(f"no smoke stand-in for model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    BySize(None, None)[size]  # validates size
    if size == "full":
        return load_model(name)
    record = EMBEDDED_MODELS[name]
    return resolve(record.smoke)(seed=seed, **{**record.smoke_shape, **smoke_shape})

