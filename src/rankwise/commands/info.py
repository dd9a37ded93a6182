"""`rankwise info DIR`: what a folder (or embedded model name) is, how it was made and how to load it.

Reads only the folder's JSON files (config.json, the manifest, quantization.json, the adapter configs,
metrics.json), so it answers at once and never loads weights; `--json` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="say what a folder is (model, adapter, MLA conversion, quantized model, ...)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("folder", metavar="DIR", help="a folder rankwise or transformers wrote, or an embedded model's name")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.models.folders import identify

    info = identify(args.folder)
    if args.json:
        print(json.dumps({"kind": info.kind, "name": info.name, "summary": info.summary, "made": info.made,
                          "load": list(info.load), "causal_lm": info.causal, "model_type": info.model_type,
                          "base_model": info.base}, indent=2, default=str))
        return 0
    print(f"{info.name}: {info.summary}")
    print(f"  kind: {info.kind}")
    made = {k: v for k, v in info.made.items() if v not in (None, [], {})}
    if made:
        print("  made with:")
        for key, value in made.items():
            print(f"    {key}: {_short(value)}")
    if info.load:
        print("  load with:")
        for line in info.load:
            print(f"    {line}")
    return 0


def _short(value: object, limit: int = 160) -> str:
    """One line per field: long per-layer lists are cut, with their length."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(value) if hasattr(value, '__len__') else '?'} items)"
