"""One page per method: the hand-written docs/methods/<slug>.md (where it exists), the record's facts, and every
experiment's committed report (docs/results/<slug>[/<experiment>]/report.md: claims with kinds, verdicts,
intervals, discrimination, the history, the tables and the plots) embedded under "Reproduction reports"."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from rankwise.core.claims_plot import claims_figure
from rankwise.core.report import CLAIMS_PLOT
from rankwise.registry import METHODS
from rankwise.registry.records import MAIN

LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")  # a Markdown link or image: [text](target)
FENCE = re.compile(r"^\s*(```|~~~)")


def _relative(target: str) -> bool:
    return not (target.startswith(("#", "/")) or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target))


def embed_report(text: str, prefix: str, demote: int = 2) -> str:
    """A report's Markdown made to sit inside another page: its headings `demote` levels lower, its relative links
    and images (plots, sibling reports) re-rooted at `prefix` (the report's folder as seen from that page)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            if line.startswith("#"):
                line = "#" * demote + line
            line = LINK.sub(lambda m: m[1] + (prefix + m[2] if _relative(m[2]) else m[2]) + m[3], line)
        out.append(line)
    return "\n".join(out)


def _facts(method) -> str:
    experiments = ", ".join(f"`{method.slug}:{e.name}`" for e in method.experiments) or "none yet"
    api = ", ".join(f"`{a}`" for a in method.api) or "none yet"
    return (f"**Family** {method.family} · **status** {method.status} · **paper** *{method.title}* · "
            f"**experiments** {experiments} · **API** {api} · [all methods](../catalogue.md)")


def _with_facts(page: str, method) -> str:
    """The hand-written page with the record's facts under its title."""
    head, sep, rest = page.partition("\n")
    if not head.startswith("# "):
        return f"# {method.slug}\n\n{_facts(method)}\n\n{page}"
    return f"{head}\n\n{_facts(method)}\n{sep}{rest}"


def _drawn_claims_plot(report_json: Path, out_folder: Path, prefix: str) -> list[str]:
    """For a report committed before reports drew their claims figure: the figure drawn now from its report.json
    into the site's copy of its folder (docs/ itself is not written), as lines to embed."""
    if not report_json.is_file():
        return []
    report = json.loads(report_json.read_text())
    figure = claims_figure(report.get("claims") or [], title=f"{report.get('slug')} ({report.get('size')}): claims")
    if figure is None:
        return []
    import matplotlib.pyplot as plt

    out_folder.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_folder / f"{CLAIMS_PLOT}.png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return ["", "#### Claims against their thresholds", "",
            "Drawn by the site from this report's report.json (the report predates the claims figure): each "
            "claim's seeds, interval and estimate against its threshold, coloured by verdict.", "",
            f"![{CLAIMS_PLOT}]({prefix}{CLAIMS_PLOT}.png)", ""]


def reproduction(method, docs: Path, out_root: Path | None = None) -> str:
    """The "Reproduction reports" section; with `out_root` (the site's sources folder), reports without a claims
    figure get one drawn there."""
    lines = ["", "## Reproduction reports", ""]
    if not method.experiments:
        return "\n".join(lines + ["This method has no registered experiment yet."]) + "\n"
    for e in method.experiments:
        folder = e.results_dir(method.slug).as_posix().removeprefix("docs/")
        report = docs / folder / "report.md"
        title = "main experiment" if e.name == MAIN else f"experiment `{e.name}`"
        lines += ["", f"### {title}: `rankwise repro {method.slug}:{e.name} --size full`", ""]
        if e.summary:
            lines += [e.summary, ""]
        if not report.is_file():
            lines.append(f"No committed full report yet: `rankwise repro {method.slug}:{e.name} --size full` "
                         f"writes it under `docs/{folder}/`.")
            continue
        lines += [f"The committed report ([on its own page](../{folder}/report.md)):", "",
                  embed_report(report.read_text(), f"../{folder}/", demote=3)]
        if out_root is not None and not (docs / folder / f"{CLAIMS_PLOT}.png").is_file():
            lines += _drawn_claims_plot(docs / folder / "report.json", out_root / folder, f"../{folder}/")
    lines += _benchmark_and_other_plots(method, docs)
    return "\n".join(lines) + "\n"


def _benchmark_and_other_plots(method, docs: Path) -> list[str]:
    """The method's benchmark (docs/results/<slug>/benchmark.md), and any plot of its results folders that no
    Markdown file there shows (a figure the report's text does not embed is still a result)."""
    lines = []
    base = docs / "results" / method.slug
    bench = base / "benchmark.md"
    if bench.is_file():
        lines += ["", "## Benchmark", "", f"From [benchmark.md](../results/{method.slug}/benchmark.md):", "",
                  embed_report(bench.read_text(), f"../results/{method.slug}/", demote=2)]
    folders = [docs / e.results_dir(method.slug).as_posix().removeprefix("docs/") for e in method.experiments]
    unshown = []
    for folder in dict.fromkeys(folders):
        texts = " ".join(p.read_text() for p in folder.glob("*.md")) if folder.is_dir() else ""
        unshown += [png for png in sorted(folder.glob("*.png")) if png.name not in texts]
    if unshown:
        lines += ["", "## Other plots", ""]
        for png in unshown:
            rel = png.relative_to(docs).as_posix()
            lines += [f"![{png.stem}](../{rel})", ""]
    return lines


def write_pages(out: Path, docs: Path, out_root: Path | None = None) -> list[Path]:
    """methods/<slug>.md for every record (and the other hand-written method pages, copied as they are); with
    `out_root` (the site's sources, where docs/results was copied) the missing claims figures are drawn there."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for page in (docs / "methods").glob("*.md"):  # e.g. care-mla-deploy.md, a page beside care-mla's
        shutil.copy2(page, out / page.name)
    for m in METHODS:
        source = docs.parent / m.docs if m.docs else docs / "methods" / f"{m.slug}.md"
        if source.is_file():
            text = _with_facts(source.read_text(), m)
        else:
            text = (f"# {m.slug}\n\n{_facts(m)}\n\n*{m.title}*. This method has no page yet: it is {m.status} "
                    "(see the [catalogue](../catalogue.md) for what that means).\n")
        path = out / f"{m.slug}.md"
        path.write_text(text.rstrip() + "\n" + reproduction(m, docs, out_root))
        written.append(path)
    return written
