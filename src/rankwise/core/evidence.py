"""Claims and their verdicts: the only way a reproduction states what it found.

A claim has a *kind* (`ClaimKind`): `paper` claims (a paper's claim against the paper's baseline) are the only ones
that can make a method *reproduced*; `invariant` claims hold by construction (checks, not evidence); `sanity` claims
guard the set-up. A claim without a kind is *unclassified*: it is counted apart and never decides anything.

Three shapes of claim, all declared (name, kind, test, threshold) before anything is measured:

- `Claim`: one measured number, `measured <op> threshold` -> PASS or FAIL. For invariants and for paper claims whose
  quantity is not random (a byte count, an exact equality).
- `PairedClaim`: per-seed values of the method and of its baseline under the same seeds. The claim is about the mean
  of the differences `d_i = method_i - baseline_i`; pairing removes what a seed does to both arms alike.
- `SampleClaim`: per-seed values of one random quantity, the claim is about their mean.

For the stochastic shapes a bootstrap 95% interval of the mean is computed (`scipy.stats.bootstrap`, BCa, falling back
to percentile when BCa is degenerate) and the verdict reads the whole interval (`interval_verdict`):

- PASS when every value of the interval satisfies `<op> threshold`,
- FAIL when no value of it does (the interval lies on the wrong side),
- INCONCLUSIVE otherwise, and also with fewer than `n_min` seeds or when nothing was measured.

Ops: `>` is superiority by more than the declared margin `threshold`; `>=` is non-inferiority with margin `threshold`
(an interval exactly at the margin clears it). A paper claim of "better" must use `>` with its margin, so that a tie,
e.g. all-zero differences against `> 0`, is a FAIL and never a PASS. `<` and `<=` mirror these.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

import numpy as np

from rankwise.core.discrimination import (COMPARISON, CONTROL, CONTROL_NOT_MEASURED, CONTROL_UNJUDGED, DISCRIMINATES,
                                          NOT_DISCRIMINATING, UNDECLARED, Discrimination, comparison)
from rankwise.errors import InvalidInputError

PAIRED_BASELINE = "the paired baseline"  # the arm a PairedClaim is a comparison with, when it names none


class ClaimKind(str, Enum):
    """What a claim is evidence of. Only `PAPER` claims decide whether a method is reproduced."""

    PAPER = "paper"
    INVARIANT = "invariant"
    SANITY = "sanity"


class Verdict(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


UNCLASSIFIED = "unclassified"
# Every kind label a report counts, in the order reports show them.
KIND_LABELS: tuple[str, ...] = (*(k.value for k in ClaimKind), UNCLASSIFIED)
CONFIDENCE = 0.95  # fixed by the evidence protocol (DESIGN.md), not a knob a reproduction may turn
DEFAULT_RESAMPLES = 9999
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def as_kind(kind: ClaimKind | str | None) -> ClaimKind | None:
    """`ClaimKind` from a kind or its name; None (or "unclassified") means unclassified."""
    if kind is None or kind == UNCLASSIFIED:
        return None
    try:
        return ClaimKind(kind)
    except ValueError:
        raise InvalidInputError(f"claim kind must be one of {list(KIND_LABELS)} or None, got {kind!r}") from None


def kind_label(kind: ClaimKind | None) -> str:
    return UNCLASSIFIED if kind is None else kind.value


def interval_verdict(low: float, high: float, op: str, threshold: float) -> Verdict:
    """PASS if every value in [low, high] satisfies `value <op> threshold`, FAIL if none does, else INCONCLUSIVE.

    A single number is the interval [x, x], so it is PASS or FAIL, never INCONCLUSIVE.
    """
    if op not in OPS:
        raise InvalidInputError(f"op must be one of {sorted(OPS)}, got {op!r}")
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise InvalidInputError(f"interval must be finite with low <= high, got [{low}, {high}]")
    holds = OPS[op]
    # For > and >= the interval's low end is its least favourable point and its high end its most favourable one;
    # for < and <= the roles swap. PASS needs the least favourable point to hold, FAIL needs the most favourable to fail.
    worst, best = (low, high) if op in (">", ">=") else (high, low)
    if holds(worst, threshold):
        return Verdict.PASS
    if not holds(best, threshold):
        return Verdict.FAIL
    return Verdict.INCONCLUSIVE


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval of a mean: `ci_method` is the one actually used ("BCa", "percentile" or "exact")."""

    n: int
    mean: float
    low: float
    high: float
    ci_method: str


def bootstrap_seed(name: str) -> int:
    """A fixed seed from a claim's name, so the same claim on the same data always gets the same interval."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def bootstrap_mean_interval(values: Sequence[float], key: str, n_resamples: int = DEFAULT_RESAMPLES) -> Interval:
    """Bootstrap 95% interval of the mean of finite `values` (n >= 2); `key` (the claim name) seeds the resampling."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
        raise InvalidInputError(f"{key!r}: a bootstrap needs >= 2 finite values in one dimension, got {x.tolist()}")
    if np.ptp(x) == 0:
        # Every resample has the same mean: the interval is that point. BCa is undefined here (its acceleration
        # divides by zero), and summing then dividing can move the point by an ulp (mean([0.1] * 3) > 0.1), which
        # would turn a tie with the threshold into a PASS; so take the value itself.
        v = float(x[0])
        return Interval(int(x.size), v, v, v, "exact")
    mean = float(x.mean())
    from scipy.stats import bootstrap  # lazy: keeps `import rankwise.core.report` light

    for ci_method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            # BCa warns and returns NaN when its jackknife is degenerate; that case is handled by the fallback.
            warnings.simplefilter("ignore")
            res = bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=CONFIDENCE, method=ci_method,
                            vectorized=True, rng=np.random.default_rng(bootstrap_seed(key)))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return Interval(int(x.size), mean, low, high, ci_method)
    raise InvalidInputError(f"{key!r}: no bootstrap interval could be computed for {x.tolist()}")


def finite_number(value: Any, what: str) -> float:
    """`value` as a finite float, or an InvalidInputError naming `what` (a non-number, NaN or infinity)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise InvalidInputError(f"{what} must be finite, got {v}")
    return v


@dataclass
class _ClaimBase:
    name: str
    description: str
    op: str
    threshold: float
    kind: ClaimKind | None = None
    # How a paper claim could have failed (`core.discrimination`); only paper claims declare it.
    discriminates: Discrimination | None = None
    # The set-up the claim is judged on (model, data, sizes), part of its fingerprint: another testbed is another claim.
    testbed: str = ""
    # Declared after an earlier verdict of a claim it replaces: said in the report, never hidden.
    post_hoc: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError(f"a claim needs a non-empty name, got {self.name!r}")
        if self.op not in OPS:
            raise InvalidInputError(f"claim {self.name!r}: op must be one of {sorted(OPS)}, got {self.op!r}")
        self.threshold = finite_number(self.threshold, f"claim {self.name!r}: threshold")
        self.kind = as_kind(self.kind)
        if self.discriminates is not None and not isinstance(self.discriminates, Discrimination):
            raise InvalidInputError(f"claim {self.name!r}: discriminates takes core.discrimination.comparison(arm) or "
                                    f"control(arm), got {self.discriminates!r}")
        if self.discriminates is not None and self.kind is not ClaimKind.PAPER:
            raise InvalidInputError(f"claim {self.name!r}: only paper claims declare how they discriminate (this one is "
                                    f"{kind_label(self.kind)})")
        self._control: _ClaimBase | None = None
        self._withheld: str | None = None

    # -- a premise that did not hold ------------------------------------------------------------------------------
    def withhold(self, reason: str) -> _ClaimBase:
        """Judge the claim INCONCLUSIVE whatever its interval says, because a premise of its testbed failed (e.g.
        most of a model's units are dead, so what is measured is not the method). The measurement stays in the
        report beside the verdict the test alone would have given; `reason` says which premise failed."""
        if not isinstance(reason, str) or not reason:
            raise InvalidInputError(f"claim {self.name!r}: withhold needs a reason")
        self._withheld = reason
        return self

    def _final(self) -> tuple[Verdict, str | None]:
        verdict, reason = self._judge()
        if self._withheld is None or reason == "not measured":
            return verdict, reason
        return Verdict.INCONCLUSIVE, (f"withheld: {self._withheld} (the test alone: {verdict.value}"
                                      + (f", {reason})" if reason else ")"))

    # -- discrimination -------------------------------------------------------------------------------------------
    def _declared_discrimination(self) -> Discrimination | None:
        return self.discriminates

    def measure_control(self, *values: Any) -> _ClaimBase:
        """Evaluate this claim's own test on its control arm (the same arguments `measure` takes)."""
        d = self._declared_discrimination()
        if d is None or d.how != CONTROL:
            raise InvalidInputError(f"claim {self.name!r} declares no control arm: declare discriminates=control(arm)")
        if self._control is not None:
            raise InvalidInputError(f"claim {self.name!r}: its control is already measured")
        shadow = dataclasses.replace(self, name=f"{self.name} [control: {d.arm}]", kind=None, discriminates=None)
        shadow.measure(*values)  # type: ignore[attr-defined]
        self._control = shadow
        return self

    @property
    def control_verdict(self) -> Verdict | None:
        return None if self._control is None else self._control.verdict

    @property
    def discrimination_status(self) -> str | None:
        """For a paper claim, whether a PASS of it is evidence (`core.discrimination`'s statuses); None otherwise."""
        if self.kind is not ClaimKind.PAPER:
            return None
        d = self._declared_discrimination()
        if d is None:
            return UNDECLARED
        if d.how == COMPARISON:
            return DISCRIMINATES
        if self._control is None or not self._control.is_measured:
            return CONTROL_NOT_MEASURED
        verdict, reason = self._control._judge()
        if verdict is Verdict.FAIL and reason is not None:  # no finite value: it did not fail the test, it has none
            return CONTROL_UNJUDGED
        return NOT_DISCRIMINATING if verdict is Verdict.PASS else DISCRIMINATES

    @property
    def fingerprint(self) -> str:
        """A digest of what the claim tests (kind, shape, op, threshold, how it discriminates, testbed, unit): once a
        verdict exists under this name, a report refuses to judge another definition under it."""
        d = self._declared_discrimination()
        parts = [kind_label(self.kind), self.shape, self.op, repr(self.threshold), "" if d is None else f"{d.how}:{d.arm}",
                 self.testbed, str(getattr(self, "unit", ""))]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]

    # Subclasses define: `shape`, `is_measured`, `measured`, `test`, `_judge()`.
    shape = "deterministic"

    @property
    def verdict(self) -> Verdict:
        return self._final()[0]

    @property
    def reason(self) -> str | None:
        """Why the verdict is what it is, where that is not just the comparison (not measured, NaN, too few seeds)."""
        return self._final()[1]

    @property
    def passed(self) -> bool:
        """Backward-compatible boolean: the verdict is PASS."""
        return self.verdict is Verdict.PASS

    def declared(self) -> dict[str, Any]:
        """The test as declared before the run; a change of any of these is recorded in the report's history."""
        return {"kind": kind_label(self.kind), "type": self.shape, "op": self.op, "threshold": self.threshold,
                "description": self.description}

    def _base_dict(self) -> dict[str, Any]:
        verdict, reason = self._final()
        d = self._declared_discrimination()
        out = {"name": self.name, "description": self.description, "kind": kind_label(self.kind), "type": self.shape,
               "verdict": verdict.value, "reason": reason, "passed": verdict is Verdict.PASS, "measured": self.measured,
               "op": self.op, "threshold": self.threshold, "test": self.test, "fingerprint": self.fingerprint,
               "testbed": self.testbed, "post_hoc": self.post_hoc}
        if self.kind is ClaimKind.PAPER:
            out["discrimination"] = {**(d.to_dict() if d else {"how": None, "arm": None}),
                                     "status": self.discrimination_status,
                                     "control_verdict": None if self.control_verdict is None else self.control_verdict.value,
                                     "control_measured": None if self._control is None else self._control.measured}
        return out


@dataclass
class Claim(_ClaimBase):
    """A deterministic claim: one number, `measured <op> threshold`. NaN or a missing measurement FAILs.

    Declared unmeasured it is INCONCLUSIVE ("not measured"); `measure(value)` fills it once.
    """

    measured: float | None = field(default=None, init=False)
    is_measured: bool = field(default=False, init=False)

    @property
    def test(self) -> str:
        return "one measured number against the threshold"

    def measure(self, value: float | None) -> Claim:
        if self.is_measured:
            raise InvalidInputError(f"claim {self.name!r} is already measured; a claim is measured once, never redone")
        self.measured = None if value is None else float(value)
        self.is_measured = True
        return self

    def _judge(self) -> tuple[Verdict, str | None]:
        if not self.is_measured:
            return Verdict.INCONCLUSIVE, "not measured"
        if self.measured is None:
            return Verdict.FAIL, "no measurement (None)"
        if not math.isfinite(self.measured):
            return Verdict.FAIL, f"measurement is {self.measured}"
        return interval_verdict(self.measured, self.measured, self.op, self.threshold), None

    def to_dict(self) -> dict[str, Any]:
        return self._base_dict()


@dataclass
class _StochasticClaim(_ClaimBase):
    n_min: int = 3
    n_resamples: int = DEFAULT_RESAMPLES
    # What one value is: a seed (a random training run) by default; "windows", "items", "repetitions" where the
    # values are per evaluation unit of one run — the report then says so instead of calling them seeds.
    unit: str = "seeds"
    samples: tuple[float, ...] | None = field(default=None, init=False)
    interval: Interval | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        # The bootstrap needs two values; the protocol asks for >= 3 seeds (5 for small effects).
        if not isinstance(self.n_min, int) or self.n_min < 2:
            raise InvalidInputError(f"claim {self.name!r}: n_min must be an int >= 2, got {self.n_min!r}")
        if not isinstance(self.n_resamples, int) or self.n_resamples < 999:
            raise InvalidInputError(f"claim {self.name!r}: n_resamples must be an int >= 999, got {self.n_resamples!r}")

    @property
    def is_measured(self) -> bool:
        return self.samples is not None

    @property
    def measured(self) -> float | None:
        """The mean (of the differences, for a paired claim); None until measured."""
        if self.interval is not None:
            return self.interval.mean
        return None if self.samples is None else float(np.mean(self.samples))

    @property
    def test(self) -> str:
        ci = self.interval.ci_method if self.interval else "BCa (percentile if degenerate)"
        return f"{self._what}, {ci}, {self.n_resamples} resamples"

    def _set_samples(self, samples: np.ndarray) -> None:
        if self.is_measured:
            raise InvalidInputError(f"claim {self.name!r} is already measured; a claim is measured once, never redone")
        if samples.size == 0:
            raise InvalidInputError(f"claim {self.name!r}: no per-seed values given")
        self.samples = tuple(float(v) for v in samples)
        if samples.size >= 2 and np.all(np.isfinite(samples)):
            self.interval = bootstrap_mean_interval(samples, self.name, self.n_resamples)

    def _judge(self) -> tuple[Verdict, str | None]:
        if self.samples is None:
            return Verdict.INCONCLUSIVE, "not measured"
        bad = [i for i, v in enumerate(self.samples) if not math.isfinite(v)]
        if bad:
            # A seed whose run diverged is a result, not noise to drop: the claim fails and says where.
            return Verdict.FAIL, f"non-finite value at seed index {bad}"
        if len(self.samples) < self.n_min:
            return Verdict.INCONCLUSIVE, f"too few {self.unit} (n={len(self.samples)} < n_min={self.n_min})"
        assert self.interval is not None
        return interval_verdict(self.interval.low, self.interval.high, self.op, self.threshold), None

    def to_dict(self) -> dict[str, Any]:
        iv = self.interval
        return {**self._base_dict(), "n": None if self.samples is None else len(self.samples), "unit": self.unit,
                "low": iv.low if iv else None, "high": iv.high if iv else None,
                "samples": None if self.samples is None else list(self.samples),
                "n_min": self.n_min, "confidence": CONFIDENCE, "n_resamples": self.n_resamples,
                "ci_method": iv.ci_method if iv else None}


def _vector(values: Sequence[float], what: str) -> np.ndarray:
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a sequence of numbers, got {values!r}") from None
    if x.ndim != 1:
        raise InvalidInputError(f"{what} must be one value per seed (1-D), got shape {x.shape}")
    return x


@dataclass
class PairedClaim(_StochasticClaim):
    """`mean(method_i - baseline_i) <op> threshold` over seeds i, judged by a paired bootstrap 95% interval.

    `method_values[i]` and `baseline_values[i]` must come from the same seed i. `>` means "better by more than the
    margin `threshold`"; `>=` means non-inferiority within the margin. Fewer than `n_min` pairs is INCONCLUSIVE.
    """

    method_values: tuple[float, ...] | None = field(default=None, init=False)
    baseline_values: tuple[float, ...] | None = field(default=None, init=False)
    shape = "paired"

    def _declared_discrimination(self) -> Discrimination | None:
        # Its baseline is measured under the same seeds in the same run: a comparison unless it says otherwise.
        return self.discriminates or comparison(PAIRED_BASELINE)
    _what = f"paired bootstrap {CONFIDENCE:.0%} CI of mean(method - baseline)"

    def measure(self, method_values: Sequence[float], baseline_values: Sequence[float]) -> PairedClaim:
        m = _vector(method_values, f"claim {self.name!r}: method values")
        b = _vector(baseline_values, f"claim {self.name!r}: baseline values")
        if m.shape != b.shape:
            raise InvalidInputError(f"claim {self.name!r}: {m.size} method values but {b.size} baseline values; "
                                    "pass one of each per seed, in the same seed order")
        self._set_samples(m - b)
        self.method_values, self.baseline_values = tuple(m.tolist()), tuple(b.tolist())
        return self

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["method_samples"] = None if self.method_values is None else list(self.method_values)
        d["baseline_samples"] = None if self.baseline_values is None else list(self.baseline_values)
        return d


@dataclass
class SampleClaim(_StochasticClaim):
    """`mean(values_i) <op> threshold` over seeds i, judged by a bootstrap 95% interval of the mean.

    For a random quantity that is not a difference against a baseline measured under the same seeds.
    """

    shape = "sample"
    _what = f"bootstrap {CONFIDENCE:.0%} CI of mean(per-seed values)"

    def measure(self, values: Sequence[float]) -> SampleClaim:
        self._set_samples(_vector(values, f"claim {self.name!r}: values"))
        return self


AnyClaim = Union[Claim, PairedClaim, SampleClaim]
