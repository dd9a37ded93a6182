"""The `rankwise` command, built from the registry: the general commands plus each method's own.

A command module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int` as default (and
optionally `on_interrupt(args) -> str`, what to tell the user after Ctrl-C: where the last checkpoint is and how to
resume). A command named with two words ("convert mla") is registered under its group's sub-parsers
(`rankwise convert ...`).

Start-up stays fast (help, `list` and argument errors answer without importing torch or transformers): command
modules import their heavy dependencies inside their run functions, never at module level or in `register`.

Every error a user can cause ends the same way, here: a `RankwiseError` prints `rankwise: error: MESSAGE` and exits
2 (argparse's code for bad arguments), Ctrl-C prints what was kept and exits 130. No traceback reaches the user
unless RANKWISE_DEBUG=1 is set.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rankwise import __version__
from rankwise.errors import InvalidInputError, RankwiseError
from rankwise.registry import COMMAND_GROUPS, all_commands

EXIT_ERROR = 2  # argparse's exit status for bad arguments; ours for every RankwiseError
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what shells report when the reader of our output closed it


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show each option's default, unless its help already says it (or it has none worth showing: a switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default is argparse.SUPPRESS  # not `in`: 0 == False
        if "default" in text.lower() or nothing or not action.option_strings:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with our help formatter; sub-parsers inherit the class, so every command gets it."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rankwise", description="Low-rank methods on real models, with reproductions.")
    parser.add_argument("--version", action="version", version=f"rankwise {__version__}", help="print the version and exit")
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
            p = sub.add_parser(group, help=COMMAND_GROUPS.get(group, ""), description=COMMAND_GROUPS.get(group))
            groups[group] = p.add_subparsers(dest="kind", required=True, metavar="KIND")
        module.register(groups[group])
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    debug = os.environ.get("RANKWISE_DEBUG", "") not in ("", "0")
    try:
        if args.quiet:
            from rankwise.core.progress import set_quiet

            set_quiet(True)
        if args.threads is not None:
            if args.threads < 1:
                raise InvalidInputError(f"--threads must be at least 1, got {args.threads}")
            import torch

            torch.set_num_threads(args.threads)
        return int(args.func(args) or 0)
    except RankwiseError as e:
        if debug:
            raise
        print(f"rankwise: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\nrankwise: interrupted. {_interrupt_message(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`rankwise list | head`): not an error of ours; silence the flush at exit as well
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _interrupt_message(args: argparse.Namespace) -> str:
    """What the interrupted command kept and how to go on: the command's own account, or a plain note."""
    describe = getattr(args, "on_interrupt", None)
    if describe is not None:
        try:
            return describe(args)
        except Exception as e:  # noqa: BLE001 - the account of an interrupt must never raise a traceback itself
            return f"(could not inspect the output: {e})"
    return "Nothing is resumable: run the command again to start over."


if __name__ == "__main__":
    sys.exit(main())
