"""The `rankwise` command. Each subcommand lives in its own module under `rankwise.commands` and is found there.

A command module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int` as default.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import rankwise.commands
from rankwise.core.progress import set_quiet
from rankwise.errors import InvalidInputError, RankwiseError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rankwise", description="Low-rank methods on real models, with reproductions.")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or status lines")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's, one per core). On a machine shared with other "
                             "jobs, 1 is often faster: busy cores make multithreaded kernels spin-wait")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(rankwise.commands.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"rankwise.commands.{info.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    set_quiet(args.quiet)
    try:
        if args.threads is not None:
            if args.threads < 1:
                raise InvalidInputError(f"--threads must be at least 1, got {args.threads}")
            import torch

            torch.set_num_threads(args.threads)
        return int(args.func(args) or 0)
    except RankwiseError as e:
        print(f"rankwise: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
