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


def png_bytes(fig: Any, dpi: int = 110) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    return buf.getvalue()


def write_benchmark(out: Path, lines: list[str], png: bytes | None = None) -> None:
    """Write out/benchmark.md (the lines) and out/benchmark.png (if given), and say where."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "benchmark.md", "\n".join(lines) + "\n")
    if png is not None:
        write_bytes_atomic(out / "benchmark.png", png)
    print(f"written to {out / 'benchmark.md'}")
