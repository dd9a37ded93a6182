"""What every benchmark's command line shares: `--smoke`, `--out` and `--threads`, parsed one way.

    parser = benchmark_parser(__doc__, "lorsa")                 # --out defaults to docs/results/lorsa
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_benchmark_args(parser, argv, smoke={"repeats": 1, "seqs": [16]})
    with limit_threads(args.threads):                           # rankwise.core.threads: the one thread limiter
        ...
        write_benchmark(args.out, lines, png, smoke=args.smoke)

`--smoke` runs the same code path at the tiny sizes the script names (explicit flags still win) and writes to a new
temporary folder unless `--out` is given; it refuses to write under docs/results, where the committed full reports
live. Benchmarks are scripts (`python benchmarks/bench_X.py`), so this module is imported from the script's own folder.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"


def benchmark_parser(doc: str, out: str, threads: int | None = 1) -> argparse.ArgumentParser:
    """A parser with the shared flags. `out`: the committed report under docs/results (a folder for benchmark.md, or
    a .md file); `threads`: the default torch intra-op thread count (None: torch's own default)."""
    parser = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one repeat: the same code path in seconds, written to a new temporary folder "
                             "unless --out is given (never under docs/results)")
    parser.add_argument("--out", type=Path, default=RESULTS / out,
                        help="output folder (benchmark.md, benchmark.png) or a .md file (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=threads,
                        help="torch intra-op threads (default: %(default)s, where None is torch's own count; one "
                             "thread keeps timings stable on a shared machine)")
    return parser


def parse_benchmark_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
                         smoke: dict[str, Any] | None = None) -> argparse.Namespace:
    """Parse `argv`; with --smoke, `smoke`'s values replace the defaults (flags given explicitly still win) and
    --out, unless given, is a new temporary folder."""
    args = parser.parse_args(argv)
    global _THREADS
    _THREADS = getattr(args, "threads", None)
    if not args.smoke:
        return args
    default_out = parser.get_default("out")
    parser.set_defaults(**(smoke or {}))
    args = parser.parse_args(argv)
    if args.out == default_out:
        args.out = Path(tempfile.mkdtemp(prefix="rankwise-benchmark-smoke-"))
    elif args.out.resolve().is_relative_to(RESULTS):
        parser.error(f"--smoke does not write under {RESULTS} (the committed reports); give another --out")
    return args


# The --threads of the last parsed command line: a page is written after `limit_threads` has restored torch's own
# count, so the count the measurements ran at is remembered here rather than read back from torch.
_THREADS: int | None = None


def threads_label() -> str:
    """The intra-op thread count the benchmark ran at, for a report: "1 thread", "2 threads" (--threads when given,
    else torch's current count)."""
    import torch

    n = _THREADS if _THREADS is not None else torch.get_num_threads()
    return f"{n} thread{'s' if n != 1 else ''}"
