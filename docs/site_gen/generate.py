"""Assemble the documentation site's sources from what the checkout holds, so that the site never drifts from it.

    python docs/site_gen/generate.py [--out build/docs-src]

writes MkDocs' `docs_dir` (mkdocs.yml points at build/docs-src): the hand-written pages of docs/site_gen/pages/,
the checkout's own Markdown (docs/*.md, docs/methods/, docs/results/ with its plots, CONTRIBUTING.md), and the
generated pages: the catalogue (from rankwise.registry), the CLI reference (from rankwise.cli's parser), the API
reference (one mkdocstrings page per package) and one page per method with its reproduction reports embedded.
Nothing is written into docs/ itself: the output folder is replaced whole on every run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_OUT = ROOT / "build" / "docs-src"

sys.path.insert(0, str(HERE))  # the sibling generator modules, when run as a script or imported by the tests

import api_reference  # noqa: E402
import catalogue  # noqa: E402
import cli_reference  # noqa: E402
import method_pages  # noqa: E402


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)


def _contributing() -> str:
    """CONTRIBUTING.md, as the "adding a method" guide: its links are relative to the checkout's root, which is
    where the site's pages (docs/...) are too, less the `docs/` prefix."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    return text.replace("](docs/", "](")


def generate(out: Path = DEFAULT_OUT) -> Path:
    """Write the site's sources into `out` (replaced whole) and return it."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _copy_tree(HERE / "pages", out)
    _copy_tree(HERE / "assets", out / "assets")
    # the checkout's own pages keep their relative places, so that their links (methods/x.md, results/...) hold
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy2(page, out / page.name)
    _copy_tree(ROOT / "docs" / "results", out / "results")
    (out / "contributing.md").write_text(_contributing())
    (out / "catalogue.md").write_text(catalogue.page())
    (out / "cli.md").write_text(cli_reference.page())
    api_reference.write_pages(out / "api")
    method_pages.write_pages(out / "methods", ROOT / "docs", out_root=out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the folder to write (replaced whole)")
    args = parser.parse_args(argv)
    print(f"site sources: {generate(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
