"""The registry-driven matrix: every registered experiment runs at size smoke and yields a well-formed report."""

import pytest

from rankwise.core.report import Report
from rankwise.registry import all_experiments
from rankwise.repro import run_reproduction

EXPERIMENTS = [pytest.param(f"{m.slug}:{e.name}", marks=pytest.mark.method(m.slug), id=f"{m.slug}:{e.name}")
               for m, e in all_experiments()]


@pytest.mark.parametrize("target", EXPERIMENTS)
def test_smoke_reproduction(target, tmp_path, smoke_report):
    slug, _, experiment = target.partition(":")
    report = smoke_report(target)
    assert isinstance(report, Report) and report.size == "smoke" and report.slug == slug
    assert report.environment["experiment"] == experiment
    assert report.claims, "a reproduction must state its claims"
    assert report.tables and all(t.rows for t in report.tables)
    assert report.wall_time_s is not None
    assert report.exit_code() == 0, "a smoke run's verdicts are not evidence: it must not fail the command"
    report.write(tmp_path)
    assert (tmp_path / "report.json").is_file() and (tmp_path / "report.md").is_file()
    assert "not expected to hold" in (tmp_path / "report.md").read_text().lower()


def test_same_seed_same_numbers(smoke_report):
    """Determinism on one cheap reproduction (each method's own tests check its seeding in depth)."""
    a = smoke_report("plop:main")  # the matrix's run
    b = run_reproduction("plop", "smoke", seed=0)
    assert [c.measured for c in a.claims] == [c.measured for c in b.claims]


def test_thread_policy_is_applied_and_restored(monkeypatch, tmp_cache):
    import torch

    from rankwise.core.report import Report
    from rankwise.registry import BY_SLUG

    seen = {}

    def fake_run(size, seed):
        seen["threads"] = torch.get_num_threads()
        r = Report("plop", "t", size, seed)
        return r.finish()

    monkeypatch.setattr("rankwise.repro.plop.main.run", fake_run)
    assert BY_SLUG["plop"].experiment().threads == 1
    before = torch.get_num_threads()
    run_reproduction("plop", "smoke")
    assert seen["threads"] == 1 and torch.get_num_threads() == before
    run_reproduction("plop", "smoke", threads=2)  # the user's --threads overrides the experiment's policy
    assert seen["threads"] == 2 and torch.get_num_threads() == before
