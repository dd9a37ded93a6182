"""`rankwise convert KIND ...`: model conversions. Each kind lives beside its method, in `rankwise.compress.<pkg>.cli`.

A converter module defines `register_converter(subparsers)`, adding its parser and setting `func(args) -> int`;
it is found here by scanning `rankwise.compress`, so a new conversion needs no edit of this file.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pkgutil

import rankwise.compress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a model (e.g. GQA attention to multi-head latent attention)")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    for info in sorted(pkgutil.iter_modules(rankwise.compress.__path__), key=lambda i: i.name):
        name = f"rankwise.compress.{info.name}.cli"
        if info.ispkg and importlib.util.find_spec(name) is not None:
            module = importlib.import_module(name)
            if hasattr(module, "register_converter"):
                module.register_converter(kinds)
