"""MkDocs hook (mkdocs.yml `hooks:`): the site's navigation, built from what exists rather than listed by hand:
the catalogue and one entry per registered method, the API pages per package, the other method pages beside them."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import api_reference  # noqa: E402

from rankwise.registry import METHODS  # noqa: E402

GUIDES = [
    {"Adapters in PEFT format": "adapters.md"},
    {"Converting to MLA and deploying": "guides/mla.md"},
    {"Quantizing": "guides/quantize.md"},
    {"Auditing a downloaded adapter": "guides/audit.md"},
    {"Training (and under torchrun)": "training.md"},
    {"Adding a method": "contributing.md"},
    {"Adapter benchmark": "results/adapters-benchmark.md"},
]


def navigation(docs_dir: Path) -> list:
    slugs = {m.slug for m in METHODS}
    extra = sorted(p.name for p in (docs_dir / "methods").glob("*.md") if p.stem not in slugs)
    methods = [{"Catalogue": "catalogue.md"}, *({m.slug: f"methods/{m.slug}.md"} for m in METHODS),
               *({p.removesuffix(".md"): f"methods/{p}"} for p in extra)]
    api = [{"Overview": "api/index.md"},
           *({("rankwise" if k == "rankwise" else f"rankwise.{k}"): f"api/{k}.md"}
             for k in api_reference.groups(api_reference.public_modules()))]
    return [{"Home": "index.md"}, {"Installation": "install.md"}, {"Guides": GUIDES}, {"Methods": methods},
            {"Command line": "cli.md"}, {"API reference": api}]


def on_config(config, **_):
    config["nav"] = navigation(Path(config["docs_dir"]))
    return config
