"""The catalogue page, from the records of `rankwise.registry`: family, status, paper and the committed full
reports' verdict counts of every method, with filters by family and status (assets/catalogue.js)."""

from __future__ import annotations

from rankwise.registry import FAMILIES, METHODS, STATUSES
from rankwise.registry.records import MAIN


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def verdicts(method) -> str:
    """Each experiment's paper-claim summary (the README table's words), linked to its report page."""
    cells = []
    for e in method.experiments:
        summary = method.claims_summary(e.name)
        if summary:
            label = "" if e.name == MAIN else f"{e.name}: "
            path = e.results_dir(method.slug).as_posix().removeprefix("docs/")
            cells.append(f"[{_cell(label + summary)}]({path}/report.md)")
    return "; ".join(cells) or "no full report"


def _select(name: str, values: list[str]) -> str:
    options = "".join(f'<option value="{v}">{v}</option>' for v in values)
    return (f'<label>{name} <select data-filter="{name}"><option value="">all</option>{options}</select></label>')


def page() -> str:
    counts = {s: sum(m.status == s for m in METHODS) for s in STATUSES}
    families = sorted({m.family for m in METHODS} & set(FAMILIES))
    lines = [
        "# Method catalogue", "",
        f"{len(METHODS)} methods: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ". Generated from the "
        "records of `rankwise.registry` (the source of `rankwise list` and of the README's table): the status is "
        "computed (*planned* until the API, the experiments and a marked test exist; *implemented* then; "
        "*reproduced* once every paper claim of every full report PASSes and discriminates).", "",
        '<div id="catalogue-filters" class="catalogue-filters">',
        _select("family", families), " ", _select("status", list(STATUSES)),
        ' <span id="catalogue-count"></span></div>', "",
        "| method | paper | family | status | full-run verdicts |",
        "|---|---|---|---|---|",
    ]
    for m in METHODS:
        lines.append(f"| [`{m.slug}`](methods/{m.slug}.md) | {_cell(m.title)} | {m.family} | {m.status} | {verdicts(m)} |")
    return "\n".join(lines) + "\n"
