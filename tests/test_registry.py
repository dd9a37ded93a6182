from pathlib import Path

import pytest

from rankwise.errors import RankwiseError, UnknownNameError
from rankwise.registry import (
    FAMILIES, METHODS, Command, Experiment, FolderFormat, MethodSpec, all_commands, demo_headlines, folder_loader,
    get_method, marked_test_slugs, parse_target, readme_with_table, repo_root, report_reproduces, resolves,
)

CARDS = Path(__file__).resolve().parents[2] / "shared" / "methods"


def test_one_entry_per_card():
    assert len(METHODS) == 38
    assert len({m.slug for m in METHODS}) == 38
    assert all(m.family in FAMILIES and m.title for m in METHODS)
    if CARDS.is_dir():
        assert {p.stem for p in CARDS.glob("*.md")} == {m.slug for m in METHODS}


def test_every_target_in_the_records_resolves():
    """A record names only things that exist: API, experiments, demos, commands, folder loaders, docs."""
    for m in METHODS:
        for target in [*m.api, *(e.run for e in m.experiments), *([m.demo] if m.demo else []),
                       *(f.loader for f in m.folder_formats), *(f"{c.module}:register" for c in m.commands)]:
            assert resolves(target), f"{m.slug}: {target} does not resolve"
        if m.docs:
            assert (repo_root() / m.docs).is_file(), f"{m.slug}: {m.docs} missing"


def test_every_contribution_a_record_names_resolves():
    """Adapters, procedures and their configs, optimizers, layers, tasks, run entries, folder formats and
    benchmarks of every record (and the general ones) exist: the derived tables can only hold real things."""
    from rankwise.registry import tables
    from rankwise.registry.general import GENERAL_FOLDER_FORMATS

    targets = [e.target for e in tables.adapter_entries().values()]
    targets += [t for e in tables.procedure_entries().values() for t in (e.builder, e.config)]
    targets += [e.factory for e in tables.optimizer_entries().values()]
    targets += [f"{e.spec}:build" for _, e in tables.layer_entries()] + [f"{e.spec}:inputs" for _, e in tables.layer_entries()]
    targets += [e.builder for e in tables.task_entries().values()]
    targets += [t for entries in tables.run_entries().values() for e in entries for t in (e.target, e.config)]
    targets += [f.loader for f in GENERAL_FOLDER_FORMATS]
    for target in targets:
        assert resolves(target), f"{target} does not resolve"
    for _, entry in tables.benchmark_entries():
        assert (repo_root() / "benchmarks" / entry.script).is_file(), entry.script


def test_status_is_computed_from_what_exists():
    ghost = MethodSpec("ghost", "t", "theory", ("rankwise.nothing_here:fn",))
    assert ghost.status == "planned"
    no_api = MethodSpec("ghost", "t", "theory")
    assert no_api.status == "planned"
    untested = MethodSpec("ghost", "t", "theory", ("rankwise.registry:METHODS",),
                          (Experiment("main", "rankwise.registry:resolve", ""),))
    assert untested.has_api() and untested.has_reproduction() and not untested.has_tests()
    assert untested.status == "planned"  # no test is marked as covering "ghost"
    for m in METHODS:
        assert m.status in ("planned", "implemented", "reproduced")
        if m.status != "planned":
            assert m.has_api() and m.has_reproduction() and m.has_tests()


def test_tests_are_found_by_marker_not_by_file_name():
    marked = marked_test_slugs()
    assert {"care-mla", "pica", "guardspace", "plop", "microscaling-ue5m3", "lora-pre"} <= marked
    assert marked <= {m.slug for m in METHODS}


def test_reproduced_needs_every_paper_claim_to_pass_and_discriminate():
    def report(*claims, size="full", protocol=3, retired=()):
        return {"size": size, "protocol": protocol, "retired": list(retired),
                "claims": [{"kind": k, "verdict": v, "discrimination": {"status": status}} for k, v, status in claims]}

    ok = "discriminates"
    assert report_reproduces(report(("paper", "PASS", ok), ("invariant", "FAIL", None)))
    assert not report_reproduces(report(("paper", "PASS", ok), ("paper", "INCONCLUSIVE", ok)))
    assert not report_reproduces(report(("invariant", "PASS", None)))  # checks by construction are not evidence
    assert not report_reproduces(report(("paper", "PASS", ok), size="smoke"))
    assert not report_reproduces(report(("paper", "PASS", ok), protocol=1))
    assert report_reproduces(report(("invariant", "PASS", None)), require_paper_claim=False)  # an extra experiment of checks
    assert not report_reproduces(report(("paper", "FAIL", ok)), require_paper_claim=False)
    # a PASS that could not have failed is no evidence
    for status in ("undeclared", "control not measured", "not discriminating (the control passes too)"):
        assert not report_reproduces(report(("paper", "PASS", ok), ("paper", "PASS", status)))
    # a paper claim replaced after its verdict still counts: its FAIL stays; a retired PASS is no longer claimed
    assert not report_reproduces(report(("paper", "PASS", ok), retired=[{"kind": "paper", "verdict": "FAIL"}]))
    assert report_reproduces(report(("paper", "PASS", ok), retired=[{"kind": "paper", "verdict": "PASS"}]))
    # protocol 2 recorded no discrimination: no evidence until rerun, paired claims included (the audits found
    # paired claims whose baseline passes too)
    legacy = {"size": "full", "protocol": 2, "claims": [{"kind": "paper", "verdict": "PASS", "type": "paired"}]}
    assert not report_reproduces(legacy)


def test_the_catalogues_summary_counts_only_discriminating_passes(monkeypatch):
    from rankwise.registry import BY_SLUG

    method = BY_SLUG["plop"]
    claim = lambda verdict, status: {"kind": "paper", "verdict": verdict, "discrimination": {"status": status}}  # noqa: E731
    reports = {3: {"size": "full", "protocol": 3, "claims": [claim("PASS", "discriminates"),
                                                                claim("PASS", "not discriminating (the control passes too)"),
                                                                claim("FAIL", "discriminates")]},
               2: {"size": "full", "protocol": 2, "claims": [{"kind": "paper", "verdict": "PASS"}]},
               # every current claim PASSes, but a retired FAIL (a claim replaced after it failed) still decides
               "retired": {"size": "full", "protocol": 3, "claims": [claim("PASS", "discriminates")],
                           "retired": [{"kind": "paper", "verdict": "FAIL"}, {"kind": "paper", "verdict": "PASS"},
                                       {"kind": "sanity", "verdict": "FAIL"}]}}
    for protocol, expected in ((3, "2/3 paper claims PASS (1 of the PASSes discriminating, 1 FAIL)"),
                               (2, "1/1 paper claims PASS (discrimination not recorded)"),
                               ("retired", "1/1 paper claims PASS (1 of the PASSes discriminating, 1 retired FAIL)")):
        monkeypatch.setattr(type(method), "report", lambda self, experiment="main", r=reports[protocol]: r)
        assert method.claims_summary() == expected


def test_the_registrys_evidence_rule_reads_the_statuses_core_writes():
    from rankwise.core import discrimination
    from rankwise.registry.records import DISCRIMINATES

    assert DISCRIMINATES == discrimination.DISCRIMINATES


def test_record_validation():
    with pytest.raises(RankwiseError, match="family"):
        MethodSpec("x", "t", "training")  # renamed to recipes: the harness package owns the name
    with pytest.raises(RankwiseError, match="first experiment"):
        MethodSpec("x", "t", "theory", experiments=(Experiment("deploy", "a:b", ""),))
    with pytest.raises(RankwiseError, match="duplicate"):
        MethodSpec("x", "t", "theory", experiments=(Experiment("main", "a:b", ""), Experiment("main", "a:c", "")))


def test_targets_and_unknown_names():
    method, experiment = parse_target("care-mla:deploy")
    assert method.slug == "care-mla" and experiment.name == "deploy"
    assert experiment.results_dir("care-mla") == Path("docs/results/care-mla/deploy")
    assert parse_target("pica")[1].name == "main"
    with pytest.raises(UnknownNameError, match="rankwise list"):
        get_method("not-a-method")
    with pytest.raises(UnknownNameError, match="experiments: main, deploy"):
        parse_target("care-mla:nope")
    with pytest.raises(RankwiseError, match="no reproduction yet"):
        parse_target("lorax")


def test_commands_demos_and_folder_formats_come_from_the_records():
    names = {c.name for c in all_commands()}
    assert {"list", "repro", "demo", "eval", "finetune", "place", "quantize", "convert mla"} <= names
    assert [m.slug for m, _ in demo_headlines()] == [m.slug for m in METHODS if m.demo]
    assert folder_loader("mla-oneshot").__name__ == "load_mla"
    with pytest.raises(UnknownNameError, match="known"):
        folder_loader("no-such-format")
    assert isinstance(Command("x", "y"), Command) and isinstance(FolderFormat("a", "b:c"), FolderFormat)


def test_readme_method_table_is_up_to_date():
    """The README's table is generated; regenerate with `rankwise list --update-readme`."""
    readme = (repo_root() / "README.md").read_text()
    assert readme == readme_with_table(readme), "README method table is stale: run `rankwise list --update-readme`"
