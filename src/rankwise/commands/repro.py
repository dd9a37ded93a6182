"""`rankwise repro SLUG`: run a reproduction and write its report."""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.registry import repo_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", help="run a method's reproduction and write docs/results/<slug>/")
    p.add_argument("slug")
    p.add_argument("--size", choices=("smoke", "full"), default="smoke")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="report folder (default: docs/results/<slug>/ for full, runs/<slug>-smoke/ for smoke)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.repro import run_reproduction

    report = run_reproduction(args.slug, size=args.size, seed=args.seed)
    root = repo_root() or Path.cwd()
    out = args.out or (root / "docs" / "results" / args.slug if args.size == "full" else root / "runs" / f"{args.slug}-smoke")
    report.write(out)
    for c in report.claims:
        print(f"[{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.measured} {c.op} {c.threshold}  ({c.description})")
    print(f"report written to {out}/report.md (wall time {report.wall_time_s:.1f} s)")
    return 0 if report.passed else 1
