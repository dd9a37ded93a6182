"""What every benchmark here writes: a Markdown page and, optionally, a PNG figure, both atomically.

Benchmarks are scripts (`python benchmarks/bench_X.py`), so this module is imported from the script's own folder.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rankwise.core.io import write_bytes_atomic, write_text_atomic


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (benchmarks run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig: Any, dpi: int = 110, **savefig: Any) -> bytes:
    """The figure as PNG bytes (further `savefig` options, e.g. bbox_inches="tight"); the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **savefig)
    pyplot().close(fig)
    return buf.getvalue()


SMOKE_NOTE = ("**Smoke run** (`--smoke`: tiny sizes, one repeat): a check that the benchmark runs, not a "
              "measurement; the committed full report is under docs/results.")


def write_benchmark(out: Path, lines: list[str], png: bytes | None = None, smoke: bool = False) -> None:
    """Write the lines as Markdown and the PNG figure (if given), and say where. `out` is a folder (out/benchmark.md,
    out/benchmark.png) or a .md file (the PNG beside it, same stem). A smoke run's page says so under its title."""
    page = out if out.suffix == ".md" else out / "benchmark.md"
    if smoke:
        lines = [*lines[:1], "", SMOKE_NOTE, *lines[1:]]
    page.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(page, "\n".join(lines).rstrip("\n") + "\n")
    if png is not None:
        write_bytes_atomic(page.with_suffix(".png"), png)
    print(f"written to {page}")
