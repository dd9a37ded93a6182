"""The method table, generated from the catalogue: one generator for the README's table and the documentation
site's catalogue page, which differ only in where their links point."""

from __future__ import annotations

from rankwise.errors import UnknownNameError
from rankwise.registry.catalogue import METHODS
from rankwise.registry.records import MAIN

TABLE_HEADER = ["| method | paper | family | status | full-run verdicts |", "|---|---|---|---|---|"]


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


def verdicts_cell(method, results_prefix: str = "") -> str:
    """Each experiment's paper-claim summary, linked to its committed report (at `results_prefix` + the report's
    path below docs/, e.g. "docs/" from the checkout's root, "" from the site's root)."""
    cells = []
    for e in method.experiments:
        summary = method.claims_summary(e.name)
        if summary:
            label = "" if e.name == MAIN else f"{e.name}: "
            path = e.results_dir(method.slug).as_posix().removeprefix("docs/")
            cells.append(f"[{_cell(label + summary)}]({results_prefix}{path}/report.md)")
    return "; ".join(cells) or "no full report"


def markdown_table(results_prefix: str = "docs/", method_pages: str | None = None) -> str:
    """The method table: slug, paper, family, status and verdicts of every registered method.

    Links are relative to the page that shows the table: reports at `results_prefix` + results/..., and with
    `method_pages` set, each slug linked to `method_pages` + <slug>.md (the site's catalogue links its method pages;
    the README, read on a forge, links the reports only).
    """
    lines = list(TABLE_HEADER)
    for m in METHODS:
        slug = f"[`{m.slug}`]({method_pages}{m.slug}.md)" if method_pages is not None else f"`{m.slug}`"
        lines.append(f"| {slug} | {_cell(m.title)} | {m.family} | {m.status} | {verdicts_cell(m, results_prefix)} |")
    return "\n".join(lines)


README_START = "<!-- methods-table:start -->"
README_END = "<!-- methods-table:end -->"


def readme_with_table(readme: str) -> str:
    """`readme` with the text between the method-table markers replaced by the generated table."""
    head, sep1, rest = readme.partition(README_START)
    _, sep2, tail = rest.partition(README_END)
    if not (sep1 and sep2):
        raise UnknownNameError(f"README lacks the markers {README_START} ... {README_END}")
    return f"{head}{README_START}\n{markdown_table()}\n{README_END}{tail}"
