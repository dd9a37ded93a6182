"""Targets: "module:attribute" strings that name code without importing it until it is used.

The registry's records name their APIs, experiments, commands and loaders this way, so that the registry imports
no method code. `defines` answers "is it there?" from the module's source text (no import, no torch) for
`rankwise list`; `resolves` and `resolve` import for real.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path
from typing import Any


def resolves(target: str) -> bool:
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return False
    return not attr or hasattr(mod, attr)


def defines(target: str) -> bool:
    """Whether a "module:attribute" target exists, read from the module's source without importing it.

    Statuses (`rankwise list`) use this so that listing the catalogue imports no method code (and no torch); a
    module whose names cannot be read from its text (a star import, a module `__getattr__`) is imported instead.
    `tests/test_registry.py` resolves every target for real.
    """
    module, _, attr = target.partition(":")
    source = _module_source(module)
    if source is None:
        return resolves(target) if not module.startswith("rankwise.") else False
    if not attr:
        return True
    names = _top_level_names(source)
    if attr in names:
        return True
    return resolves(target) if ("*" in names or "__getattr__" in names) else False


def _module_source(module: str) -> Path | None:
    """The .py file of a rankwise module (None outside rankwise or when there is none)."""
    parts = module.split(".")
    if parts[0] != "rankwise":
        return None
    base = Path(__file__).resolve().parent.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=None)
def _top_level_names(source: Path) -> frozenset[str]:
    """Names a module binds at top level (defs, classes, assignments, imports; inside top-level if/try too)."""
    import ast

    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    names: set[str] = set()

    def visit(body: list) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.ImportFrom):
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)

    visit(tree.body)
    return frozenset(names)


def resolve(target: str) -> Any:
    """The object a "module:attribute" target names."""
    module, _, attr = target.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


def literal(target: str) -> Any:
    """The value of a module-level constant written as a Python literal ("module:NAME" bound by `NAME = (...)` or
    `NAME: type = {...}`), read from the module's source without importing it: what the CLI's choices are built
    from, so that they are the source of truth itself rather than a copy. A dict gives its dict."""
    import ast

    module, _, name = target.partition(":")
    source = _module_source(module)
    if source is None or not name:
        raise LookupError(f"{target}: not a rankwise module constant")
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return ast.literal_eval(node.value)
    raise LookupError(f"{target}: no literal assignment of {name} in {source}")
