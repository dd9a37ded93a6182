"""`rankwise run SLUG[:NAME] [KEY=VALUE ...] [--config FILE.json] --out DIR`: a method on your own data.

The front door for methods that are not "fine-tune a model on a task" (domain methods: graphs, control, vision,
chemistry). A method's record names its run entries (`RunEntry`: a function and its config dataclass); the options
are the config's fields, from a JSON file and/or KEY=VALUE items (the items win), checked before any work with
the same messages as every other config (`core.options`). DIR receives `result.json` (the entry's results and the
configuration it ran with) and whatever the entry writes there. `rankwise run --list` shows what can be run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rankwise.commands.common import check_output
from rankwise.core.options import parse_key_values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a method on your own data or environment (domain methods)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", metavar="SLUG[:NAME]", help="a method with a run entry (default entry: its first)")
    p.add_argument("options", nargs="*", metavar="KEY=VALUE", help="fields of the entry's config (default: none)")
    p.add_argument("--config", type=Path, default=None, help="a JSON object of config fields (default: none)")
    p.add_argument("--out", default=None, help="output folder: new, empty, or an earlier run of this command (required; default: none)")
    p.add_argument("--list", action="store_true", help="list the run entries and their options, then exit")
    p.set_defaults(func=run)


def check_arguments(args: argparse.Namespace):
    """(slug, entry, config): everything checked before any work."""
    from rankwise.core.options import config_from_options
    from rankwise.errors import InvalidInputError
    from rankwise.registry import resolve
    from rankwise.registry.tables import run_entry

    if not args.target:
        raise InvalidInputError("name a method to run (SLUG[:NAME]); `rankwise run --list` shows them")
    if not args.out:
        raise InvalidInputError("rankwise run needs --out DIR")
    slug, entry = run_entry(args.target)
    options = {}
    if args.config is not None:
        try:
            options = json.loads(args.config.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InvalidInputError(f"--config {args.config}: not a readable JSON file ({e})") from e
        if not isinstance(options, dict):
            raise InvalidInputError(f"--config {args.config} must hold a JSON object of config fields")
    options.update(parse_key_values(args.options, "rankwise run"))
    config = config_from_options(resolve(entry.config), options, f"rankwise run {slug}:{entry.name}", "an option")
    check_output(args.out, run="run")
    return slug, entry, config


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    slug, entry, config = check_arguments(args)  # before the heavy imports: a bad argument answers at once
    import dataclasses

    from rankwise.commands.common import mark_run_folder
    from rankwise.core.io import write_json_atomic
    from rankwise.registry import resolve

    out = Path(args.out)
    mark_run_folder(out, "run")
    results = resolve(entry.target)(config, out)
    record = {"method": slug, "entry": entry.name, "config": dataclasses.asdict(config), "results": results}
    write_json_atomic(out / "result.json", json.loads(json.dumps(record, default=str)))
    print(f"{slug}:{entry.name}: wrote {out / 'result.json'}")
    return 0


def _list() -> int:
    import dataclasses

    from rankwise.registry import resolve
    from rankwise.registry.tables import run_entries

    entries = run_entries()
    if not entries:
        print("no method has a run entry yet")
    for slug, items in entries.items():
        for e in items:
            fields = ", ".join(f.name for f in dataclasses.fields(resolve(e.config)))
            print(f"{slug}:{e.name}  {e.summary}\n    options: {fields}")
    return 0
