"""Reproductions: `rankwise/repro/<slug_>/<experiment>.py`, each with `run(size, seed) -> Report`, found through the
registry's `Experiment` records. `run_reproduction` is the one runner: it validates the request, applies the
experiment's thread policy and checks what comes back."""

from __future__ import annotations

import torch

from rankwise.core.report import SIZES, Report
from rankwise.core.threads import limit_threads
from rankwise.errors import InvalidInputError, RankwiseError
from rankwise.registry import MAIN, parse_target, resolve


def run_reproduction(target: str, size: str = "smoke", seed: int = 0, threads: int | None = None) -> Report:
    """Run "SLUG" (its `main` experiment) or "SLUG:EXPERIMENT" at `size` ('smoke' or 'full'); return the report.

    `threads` overrides the experiment's thread policy (a user's `rankwise --threads N`).
    """
    if size not in SIZES:
        raise InvalidInputError(f"size must be one of {SIZES}, got {size!r}")
    method, experiment = parse_target(target)
    if not method.has_reproduction():
        raise RankwiseError(f"{method.slug} has no reproduction yet (status: {method.status})")
    with limit_threads(threads if threads is not None else experiment.threads):
        report = resolve(experiment.run)(size=size, seed=seed)
        used_threads = torch.get_num_threads()
    if not isinstance(report, Report) or report.slug != method.slug:
        raise RankwiseError(f"{experiment.run} did not return a Report for {method.slug!r}")
    if report.wall_time_s is None:
        report.finish()
    report.environment["experiment"] = experiment.name
    report.environment["cpu_threads"] = used_threads
    return report


__all__ = ["run_reproduction", "MAIN"]
