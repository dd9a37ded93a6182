"""The `rankwise` command, built from the registry: the general commands plus each method's own.

A command module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int` as default. A
command named with two words ("convert mla") is registered under its group's sub-parsers (`rankwise convert ...`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rankwise.core.progress import set_quiet
from rankwise.errors import InvalidInputError, RankwiseError
from rankwise.registry import COMMAND_GROUPS, all_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rankwise", description="Low-rank methods on real models, with reproductions.")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or status lines")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for every command (default: torch's, one per core; a reproduction "
                             "uses its experiment's own setting, usually 1). On a machine shared with other jobs, 1 is "
                             "often faster: busy cores make multithreaded kernels spin-wait")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in sorted(all_commands(), key=lambda c: c.name):
        module = importlib.import_module(command.module)
        group, _, kind = command.name.partition(" ")
        if not kind:
            module.register(sub)
            continue
        if group not in groups:
            p = sub.add_parser(group, help=COMMAND_GROUPS.get(group, ""))
            groups[group] = p.add_subparsers(dest="kind", required=True, metavar="KIND")
        module.register(groups[group])
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
