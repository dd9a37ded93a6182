"""The README's method table, generated from the catalogue."""

from __future__ import annotations

from rankwise.errors import UnknownNameError
from rankwise.registry.catalogue import METHODS
from rankwise.registry.records import MAIN


def markdown_table() -> str:
    lines = ["| method | paper | family | status | full-run verdicts |", "|---|---|---|---|---|"]
    for m in METHODS:
        cells = []
        for e in m.experiments:
            summary = m.claims_summary(e.name)
            if summary:
                label = "" if e.name == MAIN else f"{e.name}: "
                cells.append(f"[{label}{summary}]({e.results_dir(m.slug).as_posix()}/report.md)")
        lines.append(f"| `{m.slug}` | {m.title} | {m.family} | {m.status} | {'; '.join(cells)} |")
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
