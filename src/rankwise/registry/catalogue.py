"""The catalogue: every record, by slug, and the look-ups the rest of the package makes of it."""

from __future__ import annotations

from collections.abc import Callable

from rankwise.errors import RankwiseError, UnknownNameError
from rankwise.registry.families import adapters, algorithms, apps, compress, nn, optim, quant, recipes
from rankwise.registry.general import GENERAL_COMMANDS, GENERAL_FOLDER_FORMATS
from rankwise.registry.records import MAIN, Command, Experiment, MethodSpec
from rankwise.targets import resolve

# In slug order (the README table's order); one family file each, so no file holds all 38.
METHODS: tuple[MethodSpec, ...] = tuple(sorted(
    (*adapters.METHODS, *algorithms.METHODS, *apps.METHODS, *compress.METHODS, *nn.METHODS, *optim.METHODS,
     *quant.METHODS, *recipes.METHODS), key=lambda m: m.slug))
BY_SLUG = {m.slug: m for m in METHODS}
if len(BY_SLUG) != len(METHODS):
    raise RankwiseError("two records share a slug")


def get_method(slug: str) -> MethodSpec:
    if slug not in BY_SLUG:
        raise UnknownNameError(f"unknown method {slug!r}; `rankwise list` shows the {len(METHODS)} known slugs")
    return BY_SLUG[slug]


def parse_target(target: str) -> tuple[MethodSpec, Experiment]:
    """"SLUG" or "SLUG:EXPERIMENT" -> (method, experiment)."""
    slug, _, name = target.partition(":")
    method = get_method(slug)
    if not method.experiments:
        raise RankwiseError(f"{slug} has no reproduction yet (status: {method.status})")
    return method, method.experiment(name or MAIN)


def methods_with_reproduction() -> list[MethodSpec]:
    return [m for m in METHODS if m.has_reproduction()]


def all_experiments() -> list[tuple[MethodSpec, Experiment]]:
    """Every registered experiment (the smoke test matrix)."""
    return [(m, e) for m in METHODS for e in m.experiments]


def all_commands() -> list[Command]:
    """The CLI's commands: the general ones, then each method's (a command shared by methods appears once)."""
    seen: dict[str, Command] = {c.name: c for c in GENERAL_COMMANDS}
    for m in METHODS:
        for c in m.commands:
            if seen.setdefault(c.name, c) != c:
                raise RankwiseError(f"command {c.name!r} is registered with two modules: {seen[c.name].module}, {c.module}")
    return list(seen.values())


def demo_headlines() -> list[tuple[MethodSpec, Callable]]:
    return [(m, resolve(m.demo)) for m in METHODS if m.demo]


def folder_loader(fmt: str) -> Callable:
    """The loader of a rankwise folder format (config.json's "rankwise_format")."""
    formats = [*GENERAL_FOLDER_FORMATS, *(f for m in METHODS for f in m.folder_formats)]
    for f in formats:
        if f.name == fmt:
            return resolve(f.loader)
    known = sorted(f.name for f in formats)
    raise UnknownNameError(f"rankwise format {fmt!r} is unknown to this version; known: {known}")


