"""The catalogue page, from the records of `rankwise.registry`: family, status, paper and the committed full
reports' verdict counts of every method, with filters by family and status (assets/catalogue.js)."""

from __future__ import annotations

from rankwise.registry import FAMILIES, METHODS, STATUSES, markdown_table


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
        # the README's table, from the same generator, with the site's links (method pages, results/ at the root)
        markdown_table(results_prefix="", method_pages="methods/"),
    ]
    return "\n".join(lines) + "\n"
