"""`rankwise repro SLUG[:EXPERIMENT]`: run a reproduction experiment and write its report."""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.commands.common import check_output, mark_run_folder
from rankwise.registry import parse_target, repo_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", help="run a method's reproduction and write docs/results/<slug>/")
    p.add_argument("target", metavar="SLUG[:EXPERIMENT]", help="a method slug (its main experiment) or slug:experiment, e.g. care-mla:deploy")
    p.add_argument("--size", choices=("smoke", "full"), default="smoke",
                   help="smoke: seconds, tiny models, claims not expected to hold; full: the evidence run, <= 30 min on 2 cores (default: smoke)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the experiment")
    p.add_argument("--out", type=Path, help="report folder (default: docs/results/<slug>[/<experiment>]/ for full, runs/<slug>[-<experiment>]-smoke/ for smoke)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.repro import run_reproduction

    method, experiment = parse_target(args.target)  # a bad name fails before any work
    if args.out is not None:
        # new, empty, or an earlier `repro --out` folder: a user's own report.md / report.json are never overwritten
        check_output(args.out, run="repro")
    report = run_reproduction(args.target, size=args.size, seed=args.seed, threads=args.threads)
    root = repo_root() or Path.cwd()
    suffix = "" if experiment.name == "main" else f"-{experiment.name}"
    out = args.out or (root / experiment.results_dir(method.slug) if args.size == "full" else root / "runs" / f"{method.slug}{suffix}-smoke")
    if args.out is not None:
        mark_run_folder(out, "repro")
    report.write(out)
    print(report.summary_text())
    print(f"report written to {out}/report.md (wall time {report.wall_time_s:.1f} s)")
    return report.exit_code()
