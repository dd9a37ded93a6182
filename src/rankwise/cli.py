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
import contextlib
import errno
import importlib
import os
import sys
from pathlib import Path

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
    out = getattr(args, "out", None)
    fresh_out = bool(out) and not os.path.lexists(out)  # a refused run must not leave a folder it created behind
    try:
        if args.quiet:
            from rankwise.core.progress import set_quiet

            set_quiet(True)
        if args.threads is not None:
            if args.threads < 1:
                raise InvalidInputError(f"--threads must be at least 1, got {args.threads}")
            import torch

            torch.set_num_threads(args.threads)
        with _output_lock(args):
            return int(args.func(args) or 0)
    except RankwiseError as e:
        if fresh_out:
            _drop_bare_run_folder(out)
        if debug:
            raise
        print(f"rankwise: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if fresh_out:
            _drop_bare_run_folder(out)
        if debug:
            raise
        print(f"\nrankwise: interrupted. {_interrupt_message(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`rankwise list | head`): not an error of ours; silence the flush at exit as well
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as e:
        # The last line of defence for what the user's file system refuses (a file they cannot read, a name too long)
        # wherever no check said it first: a path and the system's words, not a traceback. Anything else is a bug.
        if debug or not (_is_path_refusal(e) or e.errno in FULL_ERRNOS):
            raise
        if fresh_out:
            _drop_bare_run_folder(out)
        print(f"rankwise: error: {_path_refusal(e)}", file=sys.stderr)
        return EXIT_ERROR


# The errors of a path the user named or whose permissions they set: said in words by `main`.
PATH_ERRNOS = {errno.EACCES: "check its permissions", errno.EPERM: "check its permissions",
               errno.ENAMETOOLONG: "a name or the whole path is longer than the system allows: choose a shorter one",
               errno.ELOOP: "it is a loop of symbolic links", errno.EROFS: "the file system is read-only: choose another place",
               errno.ENOTDIR: "a part of the path is a file, not a folder", errno.EISDIR: "it is a folder, not a file"}


# A full disk or quota mid-write: every rankwise write goes to a temporary beside its target and is renamed into place
# only when complete, so what was there before (an earlier checkpoint or output) is intact, and the user can say so.
FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def _is_path_refusal(e: OSError) -> bool:
    return e.errno in PATH_ERRNOS and e.filename is not None


def _path_refusal(e: OSError) -> str:
    from rankwise.core.path_limits import shown

    if e.errno in FULL_ERRNOS:
        where = f" while writing {shown(str(e.filename))}" if e.filename else ""
        return (f"{e.strerror or 'no space left on the device'}{where}. Every write is atomic, so what was on disk "
                "before it (an earlier checkpoint, an earlier output) is intact: free some space and rerun the same "
                "command (a training run resumes from its last checkpoint)")
    return f"{shown(str(e.filename))}: {e.strerror}; {PATH_ERRNOS[e.errno]}"


def _drop_bare_run_folder(out: str) -> None:
    """Remove the --out folder this command created when it holds nothing but its run marker (refused or stopped
    before any output): a folder with only `rankwise-run.json` would otherwise look like a run to `rankwise info`."""
    from rankwise.commands.common import RUN_MARKER

    folder = Path(out)
    try:
        if folder.is_dir() and [p.name for p in folder.iterdir()] == [RUN_MARKER]:
            (folder / RUN_MARKER).unlink()
            folder.rmdir()
    except OSError:
        pass  # best effort: the folder stays as it is


def _output_lock(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """The lock of the command's --out folder (one writer per folder). Under torchrun only rank 0 takes it: every
    rank is given the same --out, and only rank 0 writes there."""
    out = getattr(args, "out", None)
    if not out or os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext()
    from rankwise.core.output_lock import output_lock

    return output_lock(out)


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
