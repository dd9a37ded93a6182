"""The records of the catalogue: one `MethodSpec` per method card, and the entries it names as strings.

A record names, as "module:attribute" strings, everything its method contributes: its public API, reproduction
experiments, demo, CLI commands, folder formats, adapter types, training procedures (with their config class),
optimizers, layers, tasks and benchmarks. Every other table (the CLI's choices, the adapter, procedure, optimizer
and layer tables, the test matrices) is derived from the records (`registry.tables`); nothing is found by scanning
modules or by naming conventions, and nothing is mirrored by hand.

A method's status is computed from what exists, never typed:
  planned      its API entry points or its `main` experiment do not resolve, or no test is marked for it;
  implemented  its entry points resolve, its `main` experiment resolves and tests carry `pytest.mark.method(slug)`;
  reproduced   implemented, the `main` experiment's committed `full` report (protocol 3) has at least one paper
               claim and every paper claim PASSes and discriminates (`claim_is_evidence`), no retired paper claim
               fell short of PASS, and every other experiment's full report has no paper claim that does not.

The registry imports nothing of rankwise but its errors and `targets`: targets are resolved on use, so the registry
sits in the bottom layer and can be read from any layer (the CLI builds its parser from it without torch).
CONTRIBUTING.md says how to add a record.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rankwise.errors import RankwiseError, UnknownNameError
from rankwise.targets import defines, resolve, resolves  # noqa: F401  (resolves: re-exported for tests)

# A family is the package a method's code lives in (theory methods live in reproductions only).
FAMILIES = {
    "adapters": "rankwise.adapters",
    "compress": "rankwise.compress",
    "quant": "rankwise.quant",
    "optim": "rankwise.optim",
    "nn": "rankwise.nn",
    "algorithms": "rankwise.algorithms",
    "recipes": "rankwise.recipes",  # training procedures that are not optimizers or layers (DFA, TraDy, WASI, ...)
    "apps": "rankwise.apps",  # domain methods: apps/<domain>/ (RL, graphs, vision, embodied control)
    "theory": "rankwise.repro",
}
STATUSES = ("planned", "implemented", "reproduced")
TRAINS = ("adapter", "base", "both")  # what a training procedure trains (ProcedureEntry.trains)
MAIN = "main"


@dataclass(frozen=True)
class Experiment:
    """One reproduction experiment: `run(size, seed) -> Report`, its report under `docs/results/<slug>[/<name>]/`.

    `threads` is the intra-op thread count the runner sets while it runs (None: leave torch's default, one per core);
    a user's `rankwise --threads N` overrides it. Small-matmul experiments use 1: a second thread mostly spin-waits.
    """

    name: str
    run: str  # "module:function"
    summary: str
    threads: int | None = 1

    def results_dir(self, slug: str) -> Path:
        base = Path("docs") / "results" / slug
        return base if self.name == MAIN else base / self.name


@dataclass(frozen=True)
class Command:
    """A CLI command a method contributes: `name` is its words ("place", "convert mla"); `module` has `register`."""

    name: str
    module: str


@dataclass(frozen=True)
class FolderFormat:
    """A model-folder format a method writes (config.json's "rankwise_format") and the loader that reads it back."""

    name: str
    loader: str  # "module:function", (path) -> (model, tokenizer)


@dataclass(frozen=True)
class AdapterEntry:
    """An adapter type (`finetune --method NAME`): `target` names its `rankwise.adapters.Adapter` subclass."""

    name: str
    target: str


@dataclass(frozen=True)
class ProcedureEntry:
    """A training procedure (`finetune --procedure NAME --procedure-option KEY=VALUE`).

    builder: "module:function" (module, task, seed, config) -> `core.training.Procedure` (annotated with the subclass it
             returns: its `runs_on` and `resumable` are read from it before any model is loaded);
    config:  "module:Class", a frozen dataclass whose fields are the procedure's options (parsed by `core.options`);
    trains:  "adapter" (needs an adapter --method), "base" (runs with --method full) or "both";
    adapters: the adapter --methods it can train (empty: any), so that another is refused before the model loads.
    What runs it (the loop, or an engine of the harness such as the federated one) is the procedure's own `engine`.
    """

    name: str
    builder: str
    config: str
    trains: str = "adapter"
    adapters: tuple[str, ...] = ()


@dataclass(frozen=True)
class OptimizerEntry:
    """An optimizer (`finetune --optimizer NAME`): `factory` names a function returning an OptimizerFactory; a
    low-rank one takes the rank first (`--optimizer-rank`); `checkpointable` False when its state holds objects a
    checkpoint cannot store."""

    name: str
    factory: str
    low_rank: bool = False
    checkpointable: bool = True


@dataclass(frozen=True)
class LayerEntry:
    """A layer of `rankwise.nn`: `spec` names a module with `build(seed)` and `inputs(generator, dtype)` for the
    layer conformance matrix."""

    name: str
    spec: str
    meta_device: bool = True  # the forward runs on the meta device (shape propagation only)


@dataclass(frozen=True)
class TaskEntry:
    """A task `finetune --task NAME` and reproductions can train on: `builder` names
    (`training.tasks.TaskRequest`) -> Task; `kind` what it is ("text-classification", "language-modelling",
    "image-classification", ...); `causal` True when it needs a causal language model; `inputs` what the model must
    read ("text" or "images", as the embedded model records say)."""

    name: str
    builder: str
    kind: str
    summary: str
    causal: bool = False
    inputs: str = "text"


@dataclass(frozen=True)
class RunEntry:
    """A way to run the method on a user's own data or environment (`rankwise run SLUG[:NAME] KEY=VALUE ...` or
    `--config FILE.json`): `target` names a function (config, out: Path) -> dict of JSON results, `config` its
    frozen config dataclass (the KEY=VALUE options, parsed by `core.options`). The first entry is the default."""

    name: str
    target: str
    config: str
    summary: str


@dataclass(frozen=True)
class BenchmarkEntry:
    """A benchmark script (`benchmarks/<script>`), side by side with its peer; every one has `--smoke`."""

    name: str
    script: str


@dataclass(frozen=True)
class MethodSpec:
    slug: str  # = the method card's file name
    title: str  # the paper's title
    family: str
    api: tuple[str, ...] = ()  # "module:attribute" of the public API
    experiments: tuple[Experiment, ...] = ()  # the first is `main`
    demo: str | None = None  # "module:function" taking a DemoContext
    commands: tuple[Command, ...] = ()
    folder_formats: tuple[FolderFormat, ...] = ()
    adapters: tuple[AdapterEntry, ...] = ()
    procedures: tuple[ProcedureEntry, ...] = ()
    optimizers: tuple[OptimizerEntry, ...] = ()
    layers: tuple[LayerEntry, ...] = ()
    tasks: tuple[TaskEntry, ...] = ()
    benchmarks: tuple[BenchmarkEntry, ...] = ()
    runs: tuple[RunEntry, ...] = ()
    docs: str | None = None  # the method page, relative to the checkout

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise RankwiseError(f"{self.slug}: family {self.family!r} not in {sorted(FAMILIES)}")
        names = [e.name for e in self.experiments]
        if names and names[0] != MAIN:
            raise RankwiseError(f"{self.slug}: the first experiment must be {MAIN!r}, got {names}")
        if len(set(names)) != len(names):
            raise RankwiseError(f"{self.slug}: duplicate experiment names {names}")
        for p in self.procedures:
            if p.trains not in TRAINS:
                raise RankwiseError(f"{self.slug}: procedure {p.name!r} trains {p.trains!r}; it must be one of {TRAINS}")

    # -- what exists ----------------------------------------------------------------------------------------------
    def experiment(self, name: str = MAIN) -> Experiment:
        for e in self.experiments:
            if e.name == name:
                return e
        known = ", ".join(e.name for e in self.experiments) or "none yet"
        raise UnknownNameError(f"{self.slug} has no experiment {name!r} (experiments: {known})")

    def has_api(self) -> bool:
        return bool(self.api) and all(defines(e) for e in self.api)

    def has_reproduction(self) -> bool:
        return bool(self.experiments) and all(defines(e.run) for e in self.experiments)

    def has_tests(self) -> bool:
        marked = marked_test_slugs()
        return True if marked is None else self.slug in marked  # installed without tests/: trust the API

    # -- what was measured ----------------------------------------------------------------------------------------
    def report(self, experiment: str = MAIN) -> dict | None:
        """The committed report of an experiment (None if absent or unreadable)."""
        root = repo_root()
        if root is None:
            return None
        path = root / self.experiment(experiment).results_dir(self.slug) / "report.json"
        try:
            return json.loads(path.read_text()) if path.is_file() else None
        except (OSError, json.JSONDecodeError):
            return None

    @property
    def status(self) -> str:
        if not (self.has_api() and self.has_reproduction() and self.has_tests()):
            return "planned"
        main, *extras = [self.report(e.name) for e in self.experiments]
        # An extra experiment (e.g. care-mla's deploy) may hold only checks; any paper claim it has must PASS too.
        if main is not None and report_reproduces(main) and all(
                r is not None and report_reproduces(r, require_paper_claim=False) for r in extras):
            return "reproduced"
        return "implemented"

    def claims_summary(self, experiment: str = MAIN) -> str:
        """Paper-claim verdicts of the committed full report, e.g. "3/4 paper claims PASS (3 of the PASSes
        discriminating, 1 INCONCLUSIVE, 1 retired FAIL)"."""
        report = self.report(experiment)
        if not report or report.get("size") != "full":
            return ""
        if report.get("protocol", 1) < 2:  # written before claims had kinds: none of them is evidence yet
            claims = report.get("claims", [])
            return f"legacy report: {sum(bool(c.get('passed')) for c in claims)}/{len(claims)} unclassified claims held"
        paper = [c for c in report.get("claims", []) if c.get("kind") == "paper"]
        counts = {v: sum(c.get("verdict") == v for c in paper) for v in ("PASS", "FAIL", "INCONCLUSIVE")}
        text = f"{counts['PASS']}/{len(paper)} paper claims PASS"
        rest = [f"{n} {v}" for v, n in counts.items() if v != "PASS" and n]
        if report.get("protocol", 1) >= 3 and counts["PASS"]:  # only a PASS that could have failed is evidence
            rest.insert(0, f"{sum(claim_is_evidence(c) for c in paper)} of the PASSes discriminating")
        elif counts["PASS"]:
            rest.insert(0, "discrimination not recorded")
        # a retired paper claim that fell short still decides the status: say so where the verdicts are read
        retired = [c for c in report.get("retired", []) if isinstance(c, dict) and c.get("kind") == "paper"]
        rest += [f"{n} retired {v}" for v in ("FAIL", "INCONCLUSIVE")
                 if (n := sum(c.get("verdict") == v for c in retired))]
        return text + (f" ({', '.join(rest)})" if rest else "")


DISCRIMINATES = "discriminates"  # = rankwise.core.discrimination.DISCRIMINATES (core is above this layer)


def claim_is_evidence(claim: dict) -> bool:
    """A paper claim, as report.json holds it, counts for *reproduced*: it PASSed and could have failed (it is a
    comparison with a baseline measured in the same run, or its control did not pass). A report written before
    claims recorded their discrimination (protocol 2) is no evidence until it is rerun: the audits found paired
    claims among them whose baseline passes too, so not even those are inferred."""
    recorded = claim.get("discrimination")
    return claim.get("verdict") == "PASS" and isinstance(recorded, dict) and recorded.get("status") == DISCRIMINATES


def report_reproduces(report: dict, require_paper_claim: bool = True) -> bool:
    """A committed report supports *reproduced*: full size, protocol >= 2, >= 1 paper claim, every paper claim PASSed
    and discriminates (`claim_is_evidence`), and no retired paper claim fell short of PASS."""
    if report.get("size") != "full" or report.get("protocol", 1) < 2:
        return False
    paper = [c for c in report.get("claims", []) if c.get("kind") == "paper"]
    # A paper claim replaced after its verdict: a FAIL or INCONCLUSIVE stays one (a redefinition cannot erase it);
    # a PASS is no longer claimed, so whether it discriminated no longer matters.
    retired = [c for c in report.get("retired", []) if isinstance(c, dict) and c.get("kind") == "paper"]
    return ((bool(paper) or not require_paper_claim) and all(claim_is_evidence(c) for c in paper)
            and all(c.get("verdict") == "PASS" for c in retired))


@lru_cache(maxsize=1)
def repo_root() -> Path | None:
    """The source checkout holding this package (src layout), if there is one."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "rankwise").is_dir():
            return parent
    return None


_MARKER = re.compile(r"""mark\.method\(\s*((?:["'][a-z0-9-]+["']\s*,?\s*)+)\)""")


@lru_cache(maxsize=1)
def marked_test_slugs() -> frozenset[str] | None:
    """Slugs named by `pytest.mark.method(...)` in the checkout's tests (None when there is no tests/ folder).

    Read from the source text so that `rankwise list` need not import pytest; tests/conftest.py checks at collection
    that every marker names a registered slug.
    """
    root = repo_root()
    if root is None or not (root / "tests").is_dir():
        return None
    found: set[str] = set()
    for path in (root / "tests").rglob("*.py"):
        for group in _MARKER.findall(path.read_text(encoding="utf-8", errors="replace")):
            found.update(re.findall(r"""["']([a-z0-9-]+)["']""", group))
    return frozenset(found)


def repro(slug: str, name: str = MAIN, summary: str = "", threads: int | None = 1, module: str | None = None) -> Experiment:
    """The experiment `rankwise.repro.<slug_>.<module or name>:run`."""
    return Experiment(name, f"rankwise.repro.{slug.replace('-', '_')}.{module or name}:run", summary, threads)


def record(slug: str, title: str, family: str, **fields: Any) -> MethodSpec:
    """A MethodSpec, lists turned into tuples (the records are written with lists for readability)."""
    return MethodSpec(slug, title, family, **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


FINETUNE = Command("finetune", "rankwise.commands.finetune")  # shared by every method that trains through finetune
QUANTIZE = Command("quantize", "rankwise.commands.quantize")  # microscaling formats and CodeQuant


