"""How a paper claim could have failed: a claim that the baseline passes too, or that holds by construction, is no
evidence of the method, however it is worded.

Every `paper` claim declares one of two ways it discriminates (DESIGN.md's evidence protocol):

- `comparison(arm)`: the claim compares the method against a named baseline arm measured in the same run (a paired
  claim's differences, or a threshold set by the baseline's own measurement). A `PairedClaim` is a comparison with
  its paired baseline unless it says otherwise.
- `control(arm)`: a named arm (the baseline, an ablation with the method's component switched off, or a negative
  control) is evaluated by the *same* claim -- same test, same threshold -- and its verdict is recorded beside the
  method's. When the control PASSES too, the claim is *not discriminating*: it says nothing about the method.

A paper claim that declares neither, or whose control was never measured or PASSES, cannot make a method
reproduced (`Report.reproduced`); the report says which, claim by claim.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.errors import InvalidInputError

COMPARISON = "comparison"
CONTROL = "control"
HOWS = (COMPARISON, CONTROL)


@dataclass(frozen=True)
class Discrimination:
    """`how` ("comparison" or "control") a claim could fail, and the `arm` that makes it so."""

    how: str
    arm: str

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise InvalidInputError(f"a claim discriminates by one of {HOWS}, got {self.how!r}")
        if not isinstance(self.arm, str) or not self.arm:
            raise InvalidInputError(f"a {self.how} names its arm (e.g. the baseline's name), got {self.arm!r}")

    def to_dict(self) -> dict[str, str]:
        return {"how": self.how, "arm": self.arm}


def comparison(arm: str) -> Discrimination:
    """The claim compares the method with baseline `arm`, measured in the same run."""
    return Discrimination(COMPARISON, arm)


def control(arm: str) -> Discrimination:
    """The same claim is also evaluated on `arm` (`claim.measure_control(...)`); it must not PASS there."""
    return Discrimination(CONTROL, arm)


# What `discrimination_status` returns, and whether each lets a PASS count as evidence.
UNDECLARED = "undeclared"
CONTROL_NOT_MEASURED = "control not measured"
# The control "failed" only because it has no finite measurement (a NaN, an infinite ratio): no evidence either way.
CONTROL_UNJUDGED = "control not judged (no finite measurement)"
NOT_DISCRIMINATING = "not discriminating (the control passes too)"
DISCRIMINATES = "discriminates"
