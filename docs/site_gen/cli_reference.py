"""The CLI reference page: every command and flag, from `rankwise.cli.build_parser()` (the source of `--help`)."""

from __future__ import annotations

import argparse
import os

from rankwise.cli import build_parser

WIDTH = "100"  # argparse wraps help to $COLUMNS: fixed, so that the page does not depend on the terminal


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(words, parser) for the parser and every sub-command under it, depth first, in the parser's order."""
    found = [(words, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += commands(sub, (*words, name))
    return found


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        help_text = (action.help or "").replace("|", "\\|").replace("\n", " ")
        if action.choices and not isinstance(action.choices, dict):
            help_text += " Choices: " + ", ".join(f"`{c}`" for c in action.choices) + "."
        rows.append(f"| {names} | {help_text} |")
    return rows


def page() -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        found = commands(build_parser())
        lines = ["# Command-line reference", "",
                 "Generated from the `rankwise` parser itself (`rankwise.cli.build_parser`), the same source as "
                 "`--help`: every command and flag below exists in this version.", ""]
        for words, parser in found[1:]:
            lines.append(f"- [`rankwise {' '.join(words)}`](#{'-'.join(words)})")
        for words, parser in found:
            title = " ".join(("rankwise", *words))
            anchor = "-".join(words) or "rankwise"
            lines += ["", f"## `{title}` {{#{anchor}}}", "", "```text", parser.format_help().rstrip(), "```", ""]
            rows = _flags(parser)
            if rows:
                lines += ["| argument | meaning |", "|---|---|", *rows]
        return "\n".join(lines) + "\n"
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
