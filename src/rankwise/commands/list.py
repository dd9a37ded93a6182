"""`rankwise list`: the method catalogue with computed statuses, read from the registry."""

from __future__ import annotations

import argparse

from rankwise.errors import RankwiseError
from rankwise.registry import METHODS, STATUSES, markdown_table, readme_with_table, repo_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="the catalogue of methods and their status")
    p.add_argument("--markdown", action="store_true", help="print the README's method table")
    p.add_argument("--update-readme", action="store_true", help="rewrite the method table in the checkout's README.md")
    p.add_argument("--experiments", action="store_true", help="also list each method's experiments (`rankwise repro SLUG:EXPERIMENT`)")
    p.add_argument("--procedures", action="store_true",
                   help="list the training procedures and their options (`finetune --procedure NAME --procedure-option KEY=VALUE`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.update_readme:
        from rankwise.core.io import write_text_atomic  # imports torch: only when writing

        root = repo_root()
        if root is None:
            raise RankwiseError("--update-readme needs the source checkout")
        readme = root / "README.md"
        write_text_atomic(readme, readme_with_table(readme.read_text()))
        print(f"updated {readme}")
        return 0
    if args.procedures:
        return list_procedures()
    if args.markdown:
        print(markdown_table())
        return 0
    width = max(len(m.slug) for m in METHODS)
    print(f"{'slug':<{width}}  {'family':<10}  {'status':<11}  paper")
    for m in METHODS:
        print(f"{m.slug:<{width}}  {m.family:<10}  {m.status:<11}  {m.title}")
        for e in m.experiments:
            verdicts = m.claims_summary(e.name) or "no full report"
            if args.experiments or e.name == "main":
                print(f"{'':<{width}}  {'':<10}  {'':<11}  - {m.slug}:{e.name}: {verdicts}" + (f" ({e.summary})" if args.experiments else ""))
    counts = {s: sum(m.status == s for m in METHODS) for s in STATUSES}
    print(f"\n{len(METHODS)} methods: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


def list_procedures() -> int:
    """Each procedure, what it trains and its options with their types, defaults and help."""
    from rankwise.core.options import describe_options
    from rankwise.registry.tables import procedure_entries
    from rankwise.targets import resolve

    for name, entry in procedure_entries().items():
        print(f"{name}  (trains {entry.trains})")
        for line in describe_options(resolve(entry.config)):
            print(f"    {line}")
    return 0
