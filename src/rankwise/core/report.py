"""The reproduction report: metrics tables, named claims with pass/fail, plots and the environment.

A reproduction fills a `Report` and returns it; `Report.write(folder)` writes `report.json`, `report.md` and one
PNG per plot. A claim's verdict is computed from its measured value and threshold, never set by hand, so a claim
that does not hold is reported as failed.
"""

from __future__ import annotations

import math
import operator
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwise.core.io import read_json, write_bytes_atomic, write_json_atomic, write_text_atomic
from rankwise.errors import InvalidInputError

SIZES = ("smoke", "full")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass
class Claim:
    """`measured <op> threshold` must hold. A NaN or missing measurement fails."""

    name: str
    description: str
    measured: float | None
    op: str
    threshold: float

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise InvalidInputError(f"claim {self.name!r}: op must be one of {sorted(_OPS)}, got {self.op!r}")

    @property
    def passed(self) -> bool:
        if self.measured is None or not math.isfinite(float(self.measured)):
            return False
        return bool(_OPS[self.op](float(self.measured), float(self.threshold)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "measured": None if self.measured is None else float(self.measured),
            "op": self.op,
            "threshold": float(self.threshold),
            "passed": self.passed,
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


@dataclass
class Report:
    """What a reproduction returns. `plots` maps a file stem to a matplotlib Figure (or PNG bytes)."""

    slug: str
    title: str
    size: str
    seed: int
    tables: list[Table] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    plots: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float | None = None

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise InvalidInputError(f"size must be one of {SIZES}, got {self.size!r}")
        self._t0 = time.perf_counter()
        if not self.environment:
            self.environment = environment()

    def table(self, name: str, columns: list[str]) -> Table:
        t = Table(name, list(columns))
        self.tables.append(t)
        return t

    def claim(self, name: str, description: str, measured: float | None, op: str, threshold: float) -> Claim:
        c = Claim(name, description, None if measured is None else float(measured), op, float(threshold))
        self.claims.append(c)
        return c

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> Report:
        """Stamp the wall time; call when the experiment is done."""
        self.wall_time_s = time.perf_counter() - self._t0
        return self

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.claims)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slug": self.slug,
            "title": self.title,
            "size": self.size,
            "seed": self.seed,
            "passed": self.passed,
            "claims": [c.to_dict() for c in self.claims],
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
        lines += ["", "## Claims", ""]
        if self.claims:
            lines += ["| claim | measured | required | verdict |", "|---|---|---|---|"]
            for c in self.claims:
                m = "n/a" if c.measured is None else _fmt(c.measured)
                lines.append(f"| **{c.name}**: {c.description} | {m} | {c.op} {_fmt(c.threshold)} | {'PASS' if c.passed else 'FAIL'} |")
        else:
            lines.append("(none)")
        for t in self.tables:
            lines += ["", f"## {t.name}", "", t.to_markdown()]
        if self.plots:
            lines += ["", "## Plots", ""] + [f"![{name}]({name}.png)" for name in self.plots]
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        env = ", ".join(f"{k} {v}" for k, v in self.environment.items())
        lines += ["", "## Environment", "", env, ""]
        return "\n".join(lines)

    def write(self, folder: str | Path) -> Path:
        """Write report.json, report.md and the plots into `folder` (each file atomically)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, plot in self.plots.items():
            write_bytes_atomic(folder / f"{name}.png", _png_bytes(plot))
        write_json_atomic(folder / "report.json", self.to_dict())
        write_text_atomic(folder / "report.md", self.to_markdown())
        return folder


def _png_bytes(plot: Any) -> bytes:
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
