"""The API reference: one page per top-level package of `rankwise`, one mkdocstrings block per public module
(every module under src/rankwise/ whose path has no part starting with "_", packages by their __init__).

mkdocstrings reads the sources statically (griffe), so no module is imported and nothing heavy runs; a module that
disappears drops out of the pages, and an object a page names that no longer exists fails the strict build."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
TOP = "rankwise"


def public_modules(src: Path = SRC) -> list[str]:
    """Dotted names of the public modules, sorted (a package before its modules)."""
    names = []
    for path in sorted((src / TOP).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts) or "__pycache__" in path.parts:
            continue
        if not in_packages(path, src):
            continue
        names.append(".".join(parts))
    return sorted(set(names), key=lambda n: n.split("."))


def in_packages(path: Path, src: Path = SRC) -> bool:
    """Whether every folder between src/ and the module is a regular package (has __init__.py): griffe, like the
    documentation it feeds, finds no module inside a namespace folder of a regular package."""
    folder = path.parent
    while folder != src:
        if not (folder / "__init__.py").is_file():
            return False
        folder = folder.parent
    return True


def skipped_modules(src: Path = SRC) -> list[str]:
    """Public modules left out because a folder above them lacks __init__.py (named on the overview page)."""
    return sorted(".".join(p.relative_to(src).with_suffix("").parts) for p in (src / TOP).rglob("*.py")
                  if "__pycache__" not in p.parts and not any(s.startswith("_") for s in p.relative_to(src).parts)
                  and not in_packages(p, src))


def groups(modules: list[str]) -> dict[str, list[str]]:
    """Page name -> its modules: `rankwise` holds the top-level modules, each sub-package its own page."""
    pages: dict[str, list[str]] = {}
    for name in modules:
        parts = name.split(".")
        is_package = (SRC.joinpath(*parts) / "__init__.py").is_file()
        key = TOP if len(parts) == 1 or (len(parts) == 2 and not is_package) else parts[1]
        pages.setdefault(key, []).append(name)
    return pages


def _block(module: str) -> str:
    return f"::: {module}\n    options:\n      heading_level: 2\n      show_root_heading: true\n      show_submodules: false\n"


def write_pages(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    pages = groups(public_modules())
    written = []
    index = ["# API reference", "",
             "Generated from the docstrings of every public module (tensor shapes are in the docstrings: weights are "
             "`[out, in]`, as torch stores them). One page per package:", ""]
    for key, modules in pages.items():
        title = TOP if key == TOP else f"{TOP}.{key}"
        index.append(f"- [`{title}`]({key}.md): {len(modules)} module{'s' if len(modules) != 1 else ''}")
        body = [f"# `{title}`", "", "Modules: " + ", ".join(f"`{m}`" for m in modules), ""]
        body += [_block(m) for m in modules]
        path = out / f"{key}.md"
        path.write_text("\n".join(body))
        written.append(path)
    skipped = skipped_modules()
    if skipped:
        index += ["", "Not rendered, because a folder above them has no `__init__.py` (so no documentation tool "
                  "finds them as part of the package): " + ", ".join(f"`{m}`" for m in skipped) + "."]
    (out / "index.md").write_text("\n".join(index) + "\n")
    return written
