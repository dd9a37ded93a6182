"""Reproductions: one module per method, `rankwise.repro.<slug_>`, each with `run(size, seed) -> Report`."""

from __future__ import annotations

import importlib

from rankwise.core.report import SIZES, Report
from rankwise.errors import InvalidInputError, RankwiseError
from rankwise.registry import get_method


def run_reproduction(slug: str, size: str = "smoke", seed: int = 0) -> Report:
    """Run a method's reproduction at `size` ('smoke' or 'full') and return its finished report."""
    if size not in SIZES:
        raise InvalidInputError(f"size must be one of {SIZES}, got {size!r}")
    method = get_method(slug)
    if not method.has_reproduction():
        raise RankwiseError(f"{slug} has no reproduction yet (status: {method.status})")
    module = importlib.import_module(method.reproduction)
    report = module.run(size=size, seed=seed)
    if not isinstance(report, Report) or report.slug != slug:
        raise RankwiseError(f"{method.reproduction}.run did not return a Report for {slug!r}")
    if report.wall_time_s is None:
        report.finish()
    return report
