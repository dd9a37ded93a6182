import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RANKWISE_QUIET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from rankwise.core.progress import set_quiet  # noqa: E402

set_quiet(True)

# `make test` runs the suite on two xdist workers, one per core: each worker's torch gets one thread, so that two
# workers never ask for more threads than the machine has (oversubscribed 2-thread kernels spin).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--method", action="append", default=[], metavar="SLUG",
                     help="run only the tests marked pytest.mark.method(SLUG) (repeatable)")


def pytest_collection_modifyitems(config, items):
    """Every `method` marker must name a registered slug; `--method SLUG` keeps only that method's tests."""
    from rankwise.registry import BY_SLUG

    wanted = set(config.getoption("--method"))
    unknown = wanted - set(BY_SLUG)
    for item in items:
        for mark in item.iter_markers("method"):
            if not mark.args:
                raise pytest.UsageError(f"{item.nodeid}: pytest.mark.method needs at least one slug")
            unknown |= set(mark.args) - set(BY_SLUG)
    if unknown:
        raise pytest.UsageError(f"unknown method slug(s) {sorted(unknown)} in markers or --method; see `rankwise list`")
    if wanted:
        keep = [i for i in items if any(wanted & set(m.args) for m in i.iter_markers("method"))]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private RANKWISE_CACHE so a test's cache files never touch the user's."""
    monkeypatch.setenv("RANKWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


_SMOKE_REPORTS: dict = {}


@pytest.fixture
def smoke_report(tmp_cache):
    """`smoke_report("slug:experiment")`: that experiment's smoke report at seed 0, run once per session (the
    reproduction matrix and a method's own checks of the same run share it; the run is deterministic)."""
    from rankwise.repro import run_reproduction

    def get(target: str):
        if target not in _SMOKE_REPORTS:
            _SMOKE_REPORTS[target] = run_reproduction(target, size="smoke", seed=0)
        return _SMOKE_REPORTS[target]

    return get


@pytest.fixture(scope="session")
def smollm2():
    from rankwise.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def tokenizer():
    from rankwise.models import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
