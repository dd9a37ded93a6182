"""Tables derived from the records: what the CLI offers and what the packages build, each from one source.

Every function here reads names and strings only (no method code is imported), so the CLI builds its parser from
them without torch; the consumers resolve a target when they use it (`rankwise.targets.resolve`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from rankwise.errors import RankwiseError, UnknownNameError
from rankwise.registry.catalogue import METHODS
from rankwise.registry.general import GENERAL_ADAPTERS, GENERAL_BENCHMARKS, GENERAL_OPTIMIZERS, GENERAL_TASKS
from rankwise.registry.records import (AdapterEntry, BenchmarkEntry, LayerEntry, MethodSpec, OptimizerEntry,
                                       ProcedureEntry, RunEntry, TaskEntry)

E = TypeVar("E")


def _unique(kind: str, entries: Iterable[tuple[str | None, E]]) -> dict[str, tuple[str | None, E]]:
    """name -> (slug of the contributing method or None for a general entry, entry); a name given twice is an error."""
    table: dict[str, tuple[str | None, E]] = {}
    for slug, entry in entries:
        name = entry.name  # type: ignore[attr-defined]
        if name in table:
            raise RankwiseError(f"{kind} {name!r} is registered twice ({table[name][0] or 'general'} and {slug or 'general'})")
        table[name] = (slug, entry)
    return table


def _of(field: str, general: Iterable[E] = ()) -> dict[str, tuple[str | None, E]]:
    pairs = [(None, e) for e in general] + [(m.slug, e) for m in METHODS for e in getattr(m, field)]
    return _unique(field.rstrip("s"), pairs)


def adapter_entries() -> dict[str, AdapterEntry]:
    """`finetune --method NAME`: every adapter type, by name."""
    return {n: e for n, (_, e) in _of("adapters", GENERAL_ADAPTERS).items()}


def procedure_entries() -> dict[str, ProcedureEntry]:
    """`finetune --procedure NAME`: every training procedure, by name."""
    return {n: e for n, (_, e) in _of("procedures").items()}


def optimizer_entries() -> dict[str, OptimizerEntry]:
    """`finetune --optimizer NAME`: AdamW, GaLore and every method's optimizer, by name."""
    return {n: e for n, (_, e) in _of("optimizers", GENERAL_OPTIMIZERS).items()}


def task_entries() -> dict[str, TaskEntry]:
    """`finetune --task NAME`: the general text tasks and every method's, by name."""
    return {n: e for n, (_, e) in _of("tasks", GENERAL_TASKS).items()}


def layer_entries() -> list[tuple[str, LayerEntry]]:
    """(method slug, entry) of every layer of `rankwise.nn` (the conformance matrix)."""
    return [(slug, e) for _, (slug, e) in _of("layers").items() if slug is not None]


def benchmark_entries() -> list[tuple[str | None, BenchmarkEntry]]:
    """(method slug or None, entry) of every benchmark script under `benchmarks/`."""
    return list(_of("benchmarks", GENERAL_BENCHMARKS).values())


def run_entries() -> dict[str, list[RunEntry]]:
    """`rankwise run SLUG[:NAME]`: each method's run entries (the first is its default), by slug."""
    return {m.slug: list(m.runs) for m in METHODS if m.runs}


def run_entry(target: str) -> tuple[str, RunEntry]:
    """"SLUG" or "SLUG:NAME" -> (slug, entry); UnknownNameError naming what can be run."""
    slug, _, name = target.partition(":")
    entries = run_entries()
    if slug not in entries:
        raise UnknownNameError(f"{slug!r} has nothing to run on your own data; methods with a run entry: {sorted(entries) or 'none yet'}")
    for entry in entries[slug]:
        if not name or entry.name == name:
            return slug, entry
    raise UnknownNameError(f"{slug} has no run entry {name!r}; it has {[e.name for e in entries[slug]]}")


def procedure_method(name: str) -> MethodSpec:
    """The record that contributes procedure `name`."""
    for m in METHODS:
        if any(p.name == name for p in m.procedures):
            return m
    raise UnknownNameError(f"unknown training procedure {name!r}; known: {sorted(procedure_entries())}")
