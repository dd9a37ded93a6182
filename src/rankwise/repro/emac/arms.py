"""The arms of the EMAC reproduction, each an `EmacConfig` of the same online pass (`adapt_stream`), and one run.

All arms: the same source model, streams, batch (32), Adam on the batch-norm affine parameters, the same rejection
rule (the unknown-energy mixture's posterior > 0.5), and, for the active ones, the same label budget (3% of the
stream, spread evenly) and the same loss (MME + clustering-contrastive + cross-entropy on the labels): they differ
only in which samples they send to the oracle. Every adapting arm's learning rate is tuned on the validation stream.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from rankwise.apps.vision.emac import EmacConfig, adapt_stream
from rankwise.repro.emac.data import Stream

ARMS: dict[str, dict] = {
    "source": {"loss": "none", "selector": "none"},
    "tent": {"loss": "tent", "selector": "none"},
    "shot-im": {"loss": "shot-im", "selector": "none"},
    "open-tent": {"loss": "open-tent", "selector": "none"},
    "simatta": {"loss": "simatta", "selector": "simatta"},
    "random": {"loss": "emac", "selector": "random"},
    "entropy": {"loss": "emac", "selector": "entropy"},
    "coreset": {"loss": "emac", "selector": "coreset"},
    "badge": {"loss": "emac", "selector": "badge"},
    "emac": {"loss": "emac", "selector": "emac"},
    "emac-no-mix": {"loss": "emac", "selector": "emac", "restrict_to_mix": False},
}
UNSUPERVISED = ("tent", "shot-im", "open-tent")
LABELS = {"source": "source only", "tent": "TENT", "shot-im": "SHOT-IM", "open-tent": "open-set TENT (energy + MME)",
          "simatta": "SimATTA-like", "random": "random selection", "entropy": "entropy selection",
          "coreset": "coreset selection", "badge": "BADGE selection", "emac": "EMAC",
          "emac-no-mix": "EMAC without the X_mix restriction"}


@dataclass
class ArmRun:
    arm: str
    lr: float
    seed: int
    h_score: float
    known_acc: float
    unknown_acc: float
    region_errors: dict[str, float]
    region_sizes: dict[str, int]
    budget: int
    annotations: int
    outside_mix: int  # annotated samples outside X_mix (EMAC's restriction: 0)
    steps: int
    seconds: float
    diverged: str | None = None


def config_for(arm: str, lr: float, seed: int, budget: float, batch: int) -> EmacConfig:
    return EmacConfig(**{**ARMS[arm], "lr": lr, "seed": seed, "budget": budget, "batch_size": batch})


def run_arm(arm: str, model, stream: Stream, lr: float, seed: int, budget: float, batch: int) -> ArmRun:
    """One online pass of `arm` over `stream` (a fresh copy of `model`)."""
    from rankwise.apps.vision.emac import MIX

    t0 = time.perf_counter()
    r = adapt_stream(model, stream.images, stream.oracle, config_for(arm, lr, seed, budget, batch))
    s = r.scores
    outside = int((r.annotated & (r.regions != MIX)).sum())
    steps = -(-stream.images.shape[0] // batch)
    return ArmRun(arm, lr, seed, s["h_score"], s["known_acc"], s["unknown_acc"], dict(r.region_errors),
                  dict(r.region_sizes), r.budget, r.annotations, outside, steps, time.perf_counter() - t0, r.diverged)


def shuffled_region_errors(model, stream: Stream, seed: int, batch: int) -> dict[str, float]:
    """The negative control of the region claims: the source model's pseudo-labels (X_old: its argmax, X_new:
    UNKNOWN, X_mix: its online prediction) scored on a random partition with the same region sizes, the energies'
    order thrown away. Without the energy split the mixed region is no worse than the others."""
    import torch

    from rankwise.apps.vision.emac import REGIONS, UNKNOWN

    r = adapt_stream(model, stream.images, stream.oracle, config_for("source", 1e-3, seed, 0.0, batch))
    regions = r.regions[torch.randperm(r.regions.numel(), generator=torch.Generator().manual_seed(seed + 99))]
    with torch.no_grad():
        argmax = torch.cat([r.model(stream.images[i:i + 512]).argmax(1) for i in range(0, stream.images.shape[0], 512)])
    pseudo = [argmax, r.predictions, torch.full_like(argmax, UNKNOWN)]  # by region: old, mix, new
    errors = {}
    for k, name in enumerate(REGIONS):
        mask = regions == k
        errors[name] = 100.0 * float((pseudo[k][mask] != stream.oracle[mask]).double().mean()) if mask.any() else float("nan")
    return errors


def as_dict(run: ArmRun) -> dict:
    return dataclasses.asdict(run)
