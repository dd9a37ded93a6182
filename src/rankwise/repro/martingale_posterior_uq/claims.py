"""The coverage claims both reproductions declare, with thresholds fixed here before anything is measured.

Coverage is a proportion over repetitions; a claim's per-repetition value is that repetition's coverage indicator
averaged over the n <= 20 (independent data per n), and the protocol's bootstrap 95% interval over the repetitions
decides. "Near nominal" (90%) is the band [85%, 95%], stated as two one-sided claims; "well below nominal" is at
most 80% (10 points under).
"""

from __future__ import annotations

from rankwise.core.evidence import ClaimKind, SampleClaim
from rankwise.core.report import Report

NEAR_LOW, NEAR_HIGH, WELL_BELOW = 0.85, 0.95, 0.80
SMALL_N = 20


def declare_near_nominal(report: Report, name: str, what: str) -> None:
    report.declare(SampleClaim(f"{name}_low", f"{what}: coverage not below the band", ">=", NEAR_LOW,
                               kind=ClaimKind.PAPER))
    report.declare(SampleClaim(f"{name}_high", f"{what}: coverage not above the band", "<=", NEAR_HIGH,
                               kind=ClaimKind.PAPER))


def measure_near_nominal(report: Report, name: str, values) -> None:
    report.measure(f"{name}_low", list(values))
    report.measure(f"{name}_high", list(values))


def declare_well_below(report: Report, name: str, what: str) -> None:
    report.declare(SampleClaim(name, f"{what}: coverage well below nominal", "<=", WELL_BELOW, kind=ClaimKind.PAPER))
