"""The registry-driven benchmark matrix: every script under benchmarks/ is registered once, and each registered
script's `--smoke` run (tiny sizes, one repeat, the same code path) exits 0 and writes its benchmark.md."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise.registry.tables import benchmark_entries

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def _marks(slug, script):
    """The method's marker, and `real_model` for a benchmark of the embedded SmolLM2 / MiniLM: one that picks its
    model with `experiment_model` (its smoke run takes the tiny stand-in, but loads the real tokenizer and
    transformers: ~10-15 s where the others take 2-7 s)."""
    marks = [pytest.mark.method(slug)] if slug else []
    path = BENCHMARKS / script
    if path.is_file() and "experiment_model(" in path.read_text():
        marks.append(pytest.mark.real_model)
    return marks


SCRIPTS = [pytest.param(entry.script, marks=_marks(slug, entry.script), id=entry.name) for slug, entry in benchmark_entries()]


def test_every_script_is_registered_once():
    registered = [entry.script for _, entry in benchmark_entries()]
    on_disk = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))
    assert sorted(registered) == on_disk, "each benchmarks/bench_*.py needs exactly one BenchmarkEntry, and back"
    assert all((BENCHMARKS / script).is_file() for script in registered)


@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_benchmark(script, tmp_path, monkeypatch):
    # In this process (each script's `main(argv)`): a subprocess per script would import torch and transformers
    # again, ~4 s each. `test_a_script_runs_as_a_program` covers the `python benchmarks/X.py` entry once.
    import torch

    out = tmp_path / "out"
    monkeypatch.setenv("RANKWISE_QUIET", "1")
    monkeypatch.setenv("RANKWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their helpers (common, timing, ...) by name
    threads = torch.get_num_threads()
    try:
        code = _script(script).main(["--smoke", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)  # a script sets its --threads
    assert code in (None, 0), f"{script} --smoke returned {code}"
    _check_page(out, script)


def test_a_script_runs_as_a_program(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RANKWISE_QUIET": "1", "RANKWISE_CACHE": str(tmp_path / "cache")}
    script = "bench_tubal.py"  # the cheapest: no transformers model
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} --smoke failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    _check_page(out, script)


def _check_page(out: Path, script: str) -> None:
    page = out / "benchmark.md"
    assert page.is_file(), f"{script} --smoke wrote no {page}"
    text = page.read_text()
    assert text.startswith("# ") and "**Smoke run**" in text and "|---" in text


def _script(name: str):
    """A benchmark script loaded as a module of its own name (its `if __name__ == "__main__"` block not run)."""
    spec = importlib.util.spec_from_file_location(f"rankwise_benchmark_{Path(name).stem}", BENCHMARKS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _common():
    """benchmarks/common.py (scripts import it from their own folder; loaded here under a name of its own)."""
    spec = importlib.util.spec_from_file_location("rankwise_benchmarks_common", BENCHMARKS / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_arguments():
    """--smoke's sizes replace the defaults, explicit flags win, and it never writes under docs/results."""
    common = _common()
    RESULTS, benchmark_parser, parse_benchmark_args = common.RESULTS, common.benchmark_parser, common.parse_benchmark_args

    def parse(*argv):
        parser = benchmark_parser("doc", "my-method")
        parser.add_argument("--repeats", type=int, default=3)
        parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32])
        return parse_benchmark_args(parser, list(argv), {"repeats": 1, "sizes": [4]})

    full = parse()
    assert (full.repeats, full.sizes, full.out, full.threads, full.smoke) == (3, [16, 32], RESULTS / "my-method", 1, False)
    smoke = parse("--smoke", "--sizes", "8")
    assert (smoke.repeats, smoke.sizes) == (1, [8])
    assert smoke.out.is_dir() and not smoke.out.resolve().is_relative_to(RESULTS)
    smoke.out.rmdir()
    with pytest.raises(SystemExit):
        parse("--smoke", "--out", str(RESULTS / "lorsa"))
