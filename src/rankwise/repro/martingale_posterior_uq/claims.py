"""The coverage claims both reproductions declare, with thresholds fixed here before anything is measured.

Coverage is a proportion over repetitions; a claim's per-repetition value is that repetition's coverage indicator
averaged over the n <= 20 (independent data per n), and the protocol's bootstrap 95% interval over the repetitions
decides. "Near nominal" (90%) is the band [85%, 95%], stated as two one-sided claims; "well below nominal" is at
most 80% (10 points under).

Which of these is evidence: the target theta_inf is one forward run of the same urn, with the same alpha, that the
martingale-posterior intervals are quantiles of, so their coverage of it is nominal by construction (up to
Monte-Carlo error): an `invariant`, a check of the implementation. The paper's claim that can fail is the other
half: that the frequentist baselines, which ignore the generator, miss the deployed rule's limit at small n. Its
control is the Dirichlet shortcut judged by the same test (coverage <= 80%): if the shortcut "missed" too, the test
would be measuring Monte-Carlo noise, not the baselines' blindness to the generator.
"""

from __future__ import annotations

from rankwise.core.discrimination import control
from rankwise.core.evidence import ClaimKind, SampleClaim
from rankwise.core.report import Report

NEAR_LOW, NEAR_HIGH, WELL_BELOW = 0.85, 0.95, 0.80
SMALL_N = 20
BASELINE_CONTROL = "DWS dp_mean"  # the arm each "baseline misses" claim is also judged on


def declare_calibrated(report: Report, name: str, what: str) -> None:
    """Coverage of theta_inf by a martingale-posterior interval inside the band: by construction (see above)."""
    report.declare(SampleClaim(f"{name}_low", f"{what}: coverage not below the band", ">=", NEAR_LOW,
                               kind=ClaimKind.INVARIANT))
    report.declare(SampleClaim(f"{name}_high", f"{what}: coverage not above the band", "<=", NEAR_HIGH,
                               kind=ClaimKind.INVARIANT))


def measure_calibrated(report: Report, name: str, values) -> None:
    report.measure(f"{name}_low", list(values))
    report.measure(f"{name}_high", list(values))


def declare_well_below(report: Report, name: str, what: str, testbed: str = "", post_hoc: bool = False) -> None:
    report.declare(SampleClaim(name, f"{what}: coverage well below nominal", "<=", WELL_BELOW, kind=ClaimKind.PAPER,
                               discriminates=control(BASELINE_CONTROL), testbed=testbed, post_hoc=post_hoc))


def measure_well_below(report: Report, name: str, baseline_values, control_values) -> None:
    report.measure(name, list(baseline_values))
    report.get_claim(name).measure_control(list(control_values))
