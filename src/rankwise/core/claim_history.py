"""A report's memory of its claims across reruns into the same folder.

When a report is written where an earlier one of the same slug and size lies, `carry_history`:

- carries the earlier claim history on and appends an entry for every claim whose declared test or verdict changed,
  appeared or disappeared, so a changed threshold or a dropped claim stays visible;
- keeps the claims the new run no longer declares (replaced or dropped after a verdict) as *retired*, with their last
  state: a FAIL or INCONCLUSIVE among them still keeps the method from *reproduced* (`Report.reproduced`);
- for a full report, refuses a claim judged under a name that already has a verdict with another definition (its
  `fingerprint`: kind, shape, test, threshold, discrimination, testbed, unit). The redesign takes a new name with
  `post_hoc=True`. Smoke reports are development runs and may change freely;
- restores, for each name a report *recalls*, the earliest FAIL or INCONCLUSIVE its history holds for a claim of
  that name as a retired claim: protocol 2 fingerprinted nothing, so a claim moved to another testbed under the same
  name (only its description changed) could turn a FAIL into a PASS; recalling it keeps the FAIL counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankwise.core.evidence import AnyClaim, kind_label
from rankwise.core.io import read_json
from rankwise.errors import CorruptFileError, InvalidInputError

# Reports whose claim history a new one carries on: 2 (claims with kinds) and 3 (with discrimination and fingerprints).
HISTORY_PROTOCOLS = (2, 3)
UNREADABLE_NOTE = "previous report.json unreadable: history restarted"
STATE_KEYS = ("kind", "type", "op", "threshold", "description", "verdict")  # what a history entry records of a claim
_RETIRED_KEYS = ("name", "kind", "type", "verdict", "reason", "measured", "op", "threshold", "fingerprint", "discrimination")


@dataclass
class CarriedHistory:
    history: list[dict[str, Any]] = field(default_factory=list)
    retired: list[dict[str, Any]] = field(default_factory=list)
    unreadable: bool = False  # the previous report.json could not be read: nothing was carried


def carry_history(path: Path, slug: str, size: str, claims: Sequence[AnyClaim],
                  recalled: Mapping[str, str] | None = None) -> CarriedHistory:
    """What the report at `path` (if any) passes on to a new report of `slug`/`size` with `claims`; `recalled` maps
    claim names to why their hidden earlier verdict is restored (`recall_hidden_verdicts`)."""
    if not path.exists():
        return CarriedHistory()
    try:
        prev = read_json(path)
        if not isinstance(prev, dict):
            raise CorruptFileError(f"{path} is not a JSON object")
        if prev.get("protocol") not in HISTORY_PROTOCOLS or prev.get("slug") != slug or prev.get("size") != size:
            return CarriedHistory()  # another report (or the pre-protocol format): nothing of this one's to carry
        history, old_claims, retired = prev.get("history", []), prev.get("claims", []), prev.get("retired", [])
        if not (isinstance(history, list) and isinstance(old_claims, list) and isinstance(retired, list)
                and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in [*old_claims, *retired])):
            raise CorruptFileError(f"{path} has a malformed history, claims or retired list")
    except CorruptFileError:
        return CarriedHistory(unreadable=True)
    if size == "full":  # evidence: a verdict, once given, binds its claim's definition
        refuse_redefined(path, claims, [*old_claims, *retired])
    current = {c.name for c in claims}
    kept = [r for r in retired if r["name"] not in current]
    kept += [{k: c.get(k) for k in _RETIRED_KEYS if k in c} for c in old_claims
             if c["name"] not in current and _has_verdict(c)]
    kept += recall_hidden_verdicts(history, recalled or {}, {r["name"] for r in kept} | current)
    before = {c["name"]: {k: c.get(k) for k in STATE_KEYS} for c in old_claims}
    after = {c.name: {**c.declared(), "verdict": c.verdict.value} for c in claims}
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    changes = [{"claim": n, "when": when, "before": before.get(n), "after": s}
               for n, s in after.items() if before.get(n) != s]
    changes += [{"claim": n, "when": when, "before": s, "after": None} for n, s in before.items() if n not in after]
    return CarriedHistory([*history, *changes], kept)


def recall_hidden_verdicts(history: Sequence[Any], recalled: Mapping[str, str], taken: set[str]) -> list[dict[str, Any]]:
    """Retired records for the earliest FAIL / INCONCLUSIVE that `history` holds of each recalled claim name, named
    "NAME (until WHEN)"; a name already among `taken` (a previous recall, carried) is not added twice."""
    out = []
    for name, why in recalled.items():
        hidden = [e for e in history if isinstance(e, dict) and e.get("claim") == name and isinstance(e.get("before"), dict)
                  and e["before"].get("verdict") in ("FAIL", "INCONCLUSIVE")]
        if not hidden:
            continue
        first = hidden[0]
        label = f"{name} (until {first.get('when')})"
        if label in taken:
            continue
        before = first["before"]
        out.append({"name": label, **{k: before.get(k) for k in ("kind", "type", "op", "threshold", "verdict",
                                                                 "description")}, "reason": why})
    return out


def refuse_redefined(path: Path, claims: Sequence[AnyClaim], previous: Sequence[dict[str, Any]]) -> None:
    """Refuse a claim judged under an earlier claim's name with another definition: the changed claim needs a new
    name and `post_hoc=True`, and the old verdict stays. A protocol-2 claim had no fingerprint: its kind, shape, op
    and threshold are compared instead."""
    earlier = {c["name"]: c for c in previous if _has_verdict(c)}
    for c in claims:
        old = earlier.get(c.name)
        if old is None:
            continue
        legacy = {"kind": kind_label(c.kind), "type": c.shape, "op": c.op, "threshold": c.threshold}
        same = (old["fingerprint"] == c.fingerprint if isinstance(old.get("fingerprint"), str) else
                all(old.get(k) == v for k, v in legacy.items()))
        if not same:
            raise InvalidInputError(
                f"claim {c.name!r} already has a verdict ({old.get('verdict')}) in {path} under another definition; "
                "a claim's testbed, test, threshold, kind or discrimination cannot change after its verdict: give "
                "the changed claim a new name with post_hoc=True (the earlier verdict stays in the report)")


def _has_verdict(c: dict[str, Any]) -> bool:
    return c.get("reason") != "not measured" and c.get("verdict") in ("PASS", "FAIL", "INCONCLUSIVE")
