"""The reproduction report: metrics tables, declared claims with verdicts, fair arms, plots and the environment.

A reproduction fills a `Report` and returns it; `Report.write(folder)` writes `report.json`, `report.md` and one
PNG per plot. Claims follow the evidence protocol (`rankwise.core.evidence`): each is declared with its kind, test and
threshold before it is measured, and its verdict (PASS / FAIL / INCONCLUSIVE) is computed, never set by hand, so a
claim that does not hold is reported as failed. Only a `full` run whose paper claims all PASS is *reproduced*.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwise.core.arms import Arm, Selection, budgets_matched
from rankwise.core.evidence import (
    KIND_LABELS,
    AnyClaim,
    Claim,
    ClaimKind,
    PairedClaim,
    SampleClaim,
    Verdict,
    kind_label,
)
from rankwise.core.claim_history import UNREADABLE_NOTE, carry_history
from rankwise.core.io import read_json, write_bytes_atomic, write_json_atomic, write_text_atomic
from rankwise.errors import InvalidInputError
from rankwise.registry.records import claim_is_evidence

__all__ = ["SIZES", "PROTOCOL", "SMOKE_NOTE", "Claim", "PairedClaim", "SampleClaim", "ClaimKind", "Verdict", "Table",
           "Report", "environment", "load_report_summary"]

SIZES = ("smoke", "full")
PROTOCOL = 3  # report.json schema: 2 = claims with kinds and verdicts, arms, history; 3 = + discrimination, fingerprints, retired
SMOKE_NOTE = ("Smoke run: tiny models and few steps, so its claims are NOT expected to hold; "
              "only `full` runs are evidence.")
_KIND_TITLES = {
    "paper": "Paper claims",
    "invariant": "Invariants (hold by construction; checks, not evidence)",
    "sanity": "Sanity checks",
    "unclassified": "Unclassified (not yet given a kind; never decide reproduced)",
}


@dataclass
class Table:
    """A metrics table: method vs baselines at the same budget. Rows are dicts keyed by column name."""

    name: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, **row: Any) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise InvalidInputError(f"table {self.name!r} has no column(s) {sorted(unknown)}; columns are {self.columns}")
        self.rows.append(row)

    def to_markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(_fmt(r.get(c, "")) for c in self.columns) + " |" for r in self.rows]
        return "\n".join([head, rule, *body])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


def _cell(text: Any) -> str:
    """A markdown table cell: a `|` in a description would otherwise split the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _measured_cell(c: AnyClaim) -> str:
    if not c.is_measured:
        return "not measured"
    if isinstance(c, Claim):
        return "n/a" if c.measured is None else _fmt(c.measured)
    assert c.samples is not None
    n = f"n={len(c.samples)} {c.unit}"
    if c.interval is None:
        return f"{_fmt(c.measured)} ({n})"
    return f"{_fmt(c.interval.mean)} [{_fmt(c.interval.low)}, {_fmt(c.interval.high)}] ({n})"


def _verdict_cell(c: AnyClaim) -> str:
    verdict, reason = c.verdict.value, c.reason
    return verdict if reason is None else f"{verdict}: {_cell(reason)}"


# the file stem of the claims figure every written report carries (core.claims_plot)
CLAIMS_PLOT = "claims"


@dataclass
class Report:
    """What a reproduction returns. `plots` maps a file stem to a matplotlib Figure (or PNG bytes).

    Claims: `declare` a claim before the run, then `measure` / `measure_paired` it; `claim(...)` declares and
    measures a deterministic claim in one call. Arms: `record_arm` each arm's tuned choice and budget, and
    `check_budgets_matched` the budget entries that must be equal.
    """

    slug: str
    title: str
    size: str
    seed: int
    tables: list[Table] = field(default_factory=list)
    claims: list[AnyClaim] = field(default_factory=list)
    arms: list[Arm] = field(default_factory=list)
    plots: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    # Claims of the previous report at this folder that this run no longer declares (replaced or dropped after their
    # verdict): their last state stays in the report and in `reproduced`.
    retired: list[dict[str, Any]] = field(default_factory=list)
    # Claim names whose earlier FAIL / INCONCLUSIVE, hidden by a protocol-2 redefinition, is restored as retired.
    recalled: dict[str, str] = field(default_factory=dict)
    wall_time_s: float | None = None

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise InvalidInputError(f"size must be one of {SIZES}, got {self.size!r}")
        self._t0 = time.perf_counter()
        self._budget_checks: list[tuple[tuple[str, ...], float]] = []
        if not self.environment:
            self.environment = environment()

    def recall_hidden_verdict(self, name: str, why: str) -> None:
        """Keep the earliest FAIL / INCONCLUSIVE the carried history holds for claim `name` as a retired claim: a
        protocol-2 report let a claim move to another testbed under its old name, which hid that verdict."""
        if not why:
            raise InvalidInputError(f"recalling claim {name!r} needs the reason the report will show")
        self.recalled[name] = why

    def table(self, name: str, columns: list[str]) -> Table:
        t = Table(name, list(columns))
        self.tables.append(t)
        return t

    # --- claims -------------------------------------------------------------------------------------------------

    def declare(self, claim: AnyClaim) -> AnyClaim:
        """Register a claim (kind, test, threshold) before its measurement exists. Names are unique."""
        if not isinstance(claim, (Claim, PairedClaim, SampleClaim)):
            raise InvalidInputError(f"declare takes a Claim, PairedClaim or SampleClaim, got {type(claim).__name__}")
        if any(c.name == claim.name for c in self.claims):
            raise InvalidInputError(f"claim {claim.name!r} is already declared; give each claim its own name")
        self.claims.append(claim)
        return claim

    def get_claim(self, name: str) -> AnyClaim:
        for c in self.claims:
            if c.name == name:
                return c
        raise InvalidInputError(f"no claim {name!r} was declared; declare it before measuring "
                                f"(declared: {[c.name for c in self.claims]})")

    def measure(self, name: str, value: float | None | Sequence[float]) -> AnyClaim:
        """Fill a declared `Claim` (one number) or `SampleClaim` (per-seed values)."""
        c = self.get_claim(name)
        if isinstance(c, PairedClaim):
            raise InvalidInputError(f"claim {name!r} is paired: use measure_paired(name, method_values, baseline_values)")
        return c.measure(value)  # type: ignore[arg-type]

    def measure_paired(self, name: str, method_values: Sequence[float], baseline_values: Sequence[float]) -> PairedClaim:
        """Fill a declared `PairedClaim` with per-seed values of the method and its baseline (same seed order)."""
        c = self.get_claim(name)
        if not isinstance(c, PairedClaim):
            raise InvalidInputError(f"claim {name!r} is a {c.shape} claim, not paired: use measure(name, value)")
        return c.measure(method_values, baseline_values)

    def claim(self, name: str, description: str, measured: float | None, op: str, threshold: float,
              *, kind: ClaimKind | str | None = None, **definition: Any) -> Claim:
        """Declare and measure a deterministic claim in one call. Without `kind` it is unclassified. `definition`:
        the claim's other declared fields (`discriminates`, `testbed`, `post_hoc`)."""
        c = Claim(name, description, op, threshold, kind, **definition)
        self.declare(c)
        return c.measure(measured)

    def claim_from_runs(self, name: str, description: str, per_seed: Sequence[float], op: str, threshold: float,
                        *, kind: ClaimKind | str | None = None, **definition: Any) -> SampleClaim:
        """Declare and measure a claim about a quantity that depends on random training runs, from its per-seed values.

        A stochastic quantity is evidence only over >= 3 seeds: with fewer values the claim is INCONCLUSIVE (too few
        seeds) whatever the measurement, so a single lucky run can never make a method reproduced.
        """
        c = SampleClaim(name, description, op, threshold, kind, **definition)
        self.declare(c)
        return c.measure(list(per_seed))

    def verdict_counts(self) -> dict[str, dict[str, int]]:
        """`{kind: {"PASS": n, "FAIL": n, "INCONCLUSIVE": n}}` for every kind, unclassified included."""
        counts = {k: {v.value: 0 for v in Verdict} for k in KIND_LABELS}
        for c in self.claims:
            counts[kind_label(c.kind)][c.verdict.value] += 1
        return counts

    @property
    def reproduced(self) -> bool:
        """A `full` run with at least one paper claim, every one of them PASS *and* discriminating (a comparison, or a
        control that does not pass), and no retired paper claim (one replaced after its verdict) short of a PASS: a
        FAIL stays one. Other kinds never decide this."""
        paper = [c.to_dict() for c in self.claims if c.kind is ClaimKind.PAPER]
        retired = [r for r in self.retired if r.get("kind") == "paper"]
        return (self.size == "full" and bool(paper) and all(claim_is_evidence(c) for c in paper)
                and all(r.get("verdict") == "PASS" for r in retired))

    @property
    def passed(self) -> bool:
        """Backward-compatible: every claim, of any kind, is PASS. Use `reproduced` for what a run shows."""
        return all(c.verdict is Verdict.PASS for c in self.claims)

    def exit_code(self) -> int:
        """For a command line: 0 for a smoke run whatever its verdicts (its claims are not expected to hold);
        for a full run 1 if any claim FAILed and 0 otherwise (INCONCLUSIVE is not a failure of the program)."""
        if self.size == "smoke":
            return 0
        return int(any(c.verdict is Verdict.FAIL for c in self.claims))

    def summary_text(self) -> str:
        """What `rankwise repro` prints: the smoke banner, one line per claim (kind, verdict, measurement), counts."""
        lines = [SMOKE_NOTE] if self.size == "smoke" else []
        for c in self.claims:
            status = c.discrimination_status
            how = f" [{_discrimination_cell(c.to_dict()).replace('**', '')}]" if status is not None else ""
            lines.append(f"[{_verdict_cell(c)}] ({kind_label(c.kind)}) {c.name}: {_measured_cell(c)} {c.op} {_fmt(c.threshold)}"
                         f"{how}  ({c.description})")
        counts = self.verdict_counts()
        lines.append("verdicts: " + "; ".join(
            f"{kind} " + ", ".join(f"{n} {v}" for v, n in per.items() if n) for kind, per in counts.items() if any(per.values())))
        if self.size == "full":
            lines.append(f"reproduced: {'yes' if self.reproduced else 'no'} (every paper claim must PASS and discriminate)")
        return "\n".join(lines)

    # --- arms ---------------------------------------------------------------------------------------------------

    def record_arm(self, arm_name: str, selection: Selection, budget: dict[str, float], *, off: Any = None) -> Arm:
        """Record an arm's validation-tuned choice and its budget; an edge or untuned choice is flagged in the report.

        `off`: the grid value that switches the method's own component off (PESO's lambda = 0, LMAO's base rate 0).
        When validation chooses it, the report's reading is that the component adds nothing measurable on this
        testbed -- a finding about the component, not a FAIL of the method, and said as such."""
        if any(a.name == arm_name for a in self.arms):
            raise InvalidInputError(f"arm {arm_name!r} is already recorded")
        arm = Arm(arm_name, selection, budget)
        self.arms.append(arm)
        if off is not None and selection.tuned and selection.chosen == off:
            what = f"{selection.param} = {_fmt(off)}" if selection.param else _fmt(off)
            self.note(f"Reading: validation tuned arm {arm_name!r} to {what}, which switches the method's component off: "
                      "the component adds nothing measurable on this testbed.")
        return arm

    def check_budgets_matched(self, keys: Sequence[str], rel_tol: float = 0.0) -> dict[str, bool]:
        """Per key, are the arms' budgets equal (within `rel_tol`)? Recorded in the report (re-evaluated on output,
        so arms recorded later count too), never raised: a mismatch is a finding to show, not an error."""
        keys = tuple(str(k) for k in keys)
        result = budgets_matched(self.arms, keys, rel_tol)  # validates rel_tol
        self._budget_checks.append((keys, float(rel_tol)))
        return result

    def budget_checks(self) -> list[dict[str, Any]]:
        return [{"keys": list(keys), "rel_tol": tol, "matched": budgets_matched(self.arms, keys, tol),
                 "values": {k: {a.name: a.budget.get(k) for a in self.arms} for k in keys}}
                for keys, tol in self._budget_checks]

    # --- output -------------------------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> Report:
        """Stamp the wall time; call when the experiment is done."""
        self.wall_time_s = time.perf_counter() - self._t0
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "slug": self.slug,
            "title": self.title,
            "size": self.size,
            "seed": self.seed,
            "note_smoke": SMOKE_NOTE if self.size == "smoke" else None,
            "reproduced": self.reproduced,
            "passed": self.passed,
            "verdicts": self.verdict_counts(),
            "claims": [c.to_dict() for c in self.claims],
            "arms": [a.to_dict() for a in self.arms],
            "budget_checks": self.budget_checks(),
            "history": self.history,
            "retired": self.retired,
            "tables": [{"name": t.name, "columns": t.columns, "rows": t.rows} for t in self.tables],
            "plots": [f"{name}.png" for name in self.plots],
            "notes": self.notes,
            "environment": self.environment,
            "wall_time_s": self.wall_time_s,
        }

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", "", f"Reproduction `{self.slug}`, size `{self.size}`, seed {self.seed}."]
        if self.wall_time_s is not None:
            lines[-1] += f" Wall time {self.wall_time_s:.1f} s."
        if self.size == "smoke":
            lines += ["", f"> **{SMOKE_NOTE}**"]
        counts = self.verdict_counts()
        summary = "; ".join(f"{k}: " + ", ".join(f"{n} {v}" for v, n in counts[k].items())
                            for k in KIND_LABELS if sum(counts[k].values()))
        lines += ["", f"**Reproduced: {'yes' if self.reproduced else 'no'}** (every paper claim must PASS and discriminate). "
                      f"Verdicts: {summary or 'no claims'}."]
        lines += ["", "## Claims"]
        if not self.claims:
            lines += ["", "(none)"]
        for k in KIND_LABELS:
            group = [c for c in self.claims if kind_label(c.kind) == k]
            if not group:
                continue
            paper = k == "paper"
            lines += ["", f"### {_KIND_TITLES[k]}", "", "| claim | measured | required | verdict |" + (" discrimination |" if paper else ""),
                      "|---|---|---|---|" + ("---|" if paper else "")]
            for c in group:
                required = f"{c.op} {_fmt(c.threshold)}" + ("" if isinstance(c, Claim) else f" ({c.test})")
                label = " *(post hoc)*" if c.post_hoc else ""
                row = (f"| **{_cell(c.name)}**{label}: {_cell(c.description)} | {_measured_cell(c)} | {_cell(required)} "
                       f"| {_verdict_cell(c)} |")
                if paper:
                    row += f" {_cell(_discrimination_cell(c.to_dict()))} |"
                lines.append(row)
                detectable = _detectable_effect(c)
                if paper and detectable is not None:
                    lines.append(f"| ↳ smallest effect this interval could detect: ±{_fmt(detectable)} ({len(c.samples or ())} "
                                 f"{c.unit}) | | | | |")
        if self.retired:
            lines += ["", "### Retired claims (replaced or dropped after a verdict; a FAIL or INCONCLUSIVE among them still counts)", "",
                      "| claim | kind | last verdict | discrimination | reason |", "|---|---|---|---|---|"]
            for r in self.retired:
                lines.append(f"| {_cell(r.get('name'))} | {_cell(r.get('kind'))} | {_cell(r.get('verdict'))} "
                             f"| {_cell(_discrimination_cell(r) if r.get('kind') == 'paper' else '')} "
                             f"| {_cell(r.get('reason') or '')} |")
        if self.arms:
            lines += ["", "## Arms", "", "Each arm's value chosen on the validation split; budgets as run.", "",
                      "| arm | chosen | validation scores | budget | flag |", "|---|---|---|---|---|"]
            for a in self.arms:
                s = a.selection
                chosen = f"{s.param} = {_fmt(s.chosen)}" if s.param else _fmt(s.chosen)
                scores = ", ".join(f"{_fmt(g)}: {_fmt(v)}" for g, v in zip(s.grid, s.scores))
                budget = ", ".join(f"{k} {_fmt(v)}" for k, v in a.budget.items())
                flag = f"**FLAG: {s.flag}**" if s.flag else ""
                lines.append(f"| {_cell(a.name)} | {_cell(chosen)} | {_cell(scores)} | {_cell(budget)} | {flag} |")
        checks = self.budget_checks()
        if checks:
            lines.append("")
        for check in checks:
            for k, ok in check["matched"].items():
                vals = ", ".join(f"{arm} {_fmt(v)}" for arm, v in check["values"][k].items())
                lines.append(f"- Budget `{k}` matched across arms (rel_tol {check['rel_tol']:g}): "
                             f"{'yes' if ok else '**NO**'} ({vals})")
        for t in self.tables:
            lines += ["", f"## {t.name}", "", t.to_markdown()]
        if self.plots:
            lines += ["", "## Plots", ""] + [f"![{name}]({name}.png)" for name in self.plots]
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        if self.history:
            lines += ["", "## Claim history", "", "| when | claim | before | after |", "|---|---|---|---|"]
            for h in self.history:
                lines.append(f"| {h.get('when')} | {_cell(h.get('claim'))} | {_cell(_state(h.get('before')))} "
                             f"| {_cell(_state(h.get('after')))} |")
        env = ", ".join(f"{k} {v}" for k, v in self.environment.items())
        lines += ["", "## Environment", "", env, ""]
        return "\n".join(lines)

    def write(self, folder: str | Path) -> Path:
        """Write report.json, report.md and the plots into `folder` (each file atomically).

        A previous report of the same slug and size in `folder` passes on its claim history and its retired claims,
        and a full one refuses a claim redefined under a name that has a verdict (`core.claim_history`). An
        unreadable previous report is not used: the history restarts and a note says so.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        carried = carry_history(folder / "report.json", self.slug, self.size, self.claims, self.recalled)
        self.history, self.retired = carried.history, carried.retired
        if carried.unreadable and UNREADABLE_NOTE not in self.notes:
            self.notes.append(UNREADABLE_NOTE)
        self._add_claims_plot()
        for name, plot in self.plots.items():
            write_bytes_atomic(folder / f"{name}.png", png_bytes(plot))
        write_json_atomic(folder / "report.json", self.to_dict())
        write_text_atomic(folder / "report.md", self.to_markdown())
        return folder

    def _add_claims_plot(self) -> None:
        """The claims figure (`core.claims_plot`) as the plot CLAIMS_PLOT, unless the experiment drew its own."""
        if CLAIMS_PLOT in self.plots:
            return
        from rankwise.core.claims_plot import claims_figure

        figure = claims_figure([c.to_dict() for c in self.claims], title=f"{self.slug} ({self.size}): claims")
        if figure is not None:
            self.plots[CLAIMS_PLOT] = figure


def _discrimination_cell(c: dict[str, Any]) -> str:
    d = c.get("discrimination")
    if not isinstance(d, dict):
        return "**not recorded** (written before claims declared it)"
    how, arm, status = d.get("how"), d.get("arm"), d.get("status")
    if how is None:
        return f"**{status}**"
    control = f"; control verdict {d.get('control_verdict')}" if how == "control" else ""
    mark = "" if status == "discriminates" else "**"
    return f"{how} with {arm}{control}: {mark}{status}{mark}"


def _detectable_effect(c: AnyClaim) -> float | None:
    """The half-width of a stochastic claim's interval: effects smaller than this could not have been told apart."""
    interval = getattr(c, "interval", None)
    return None if interval is None else (interval.high - interval.low) / 2


def _state(s: dict[str, Any] | None) -> str:
    if s is None:
        return "(absent)"
    return f"{s.get('kind')} {s.get('type')}: {s.get('op')} {_fmt(s.get('threshold'))} -> {s.get('verdict')}"


def png_bytes(plot: Any) -> bytes:
    """A matplotlib Figure (closed after) or PNG bytes, as PNG bytes."""
    if isinstance(plot, (bytes, bytearray)):
        return bytes(plot)
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    plot.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(plot)
    return buf.getvalue()


def environment() -> dict[str, Any]:
    import torch
    import transformers

    import rankwise

    return {
        "rankwise": rankwise.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }


def load_report_summary(path: str | Path) -> dict[str, Any]:
    """Read a written report.json (used by the registry to compute a method's status)."""
    return read_json(path)
