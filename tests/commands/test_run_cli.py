"""`rankwise run SLUG[:NAME] KEY=VALUE ... [--config FILE] --out DIR`: the front door for methods on a user's own
data. The entry here is a test double registered for the duration of a test (a least-squares fit on generated
data), so the command's contract is checked before the first domain method uses it."""

import json
from dataclasses import dataclass, field

import pytest
import torch

from rankwise.cli import main
from rankwise.core.options import option
from rankwise.registry import RunEntry


@dataclass(frozen=True)
class FitConfig:
    rows: int = 32
    noise: float = 0.0
    solver: str = field(default="lstsq", metadata=option(choices=("lstsq", "normal")))
    seed: int = 0


def fit_line(config: FitConfig, out):
    gen = torch.Generator().manual_seed(config.seed)
    x = torch.randn(config.rows, 2, generator=gen, dtype=torch.float64)
    y = x @ torch.tensor([2.0, -1.0], dtype=torch.float64) + config.noise * torch.randn(config.rows, generator=gen, dtype=torch.float64)
    w = torch.linalg.lstsq(x, y).solution if config.solver == "lstsq" else torch.linalg.solve(x.T @ x, x.T @ y)
    (out / "weights.txt").write_text(" ".join(f"{v:.6f}" for v in w.tolist()))
    return {"weights": w.tolist()}


@pytest.fixture
def registered(monkeypatch):
    import rankwise.registry.tables as tables

    entry = RunEntry("fit", f"{__name__}:fit_line", f"{__name__}:FitConfig", "least squares on generated rows")
    monkeypatch.setattr(tables, "run_entries", lambda: {"my-method": [entry]})


def test_run_writes_the_results_and_the_configuration(registered, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"rows": 16, "solver": "normal"}))
    out = tmp_path / "out"
    assert main(["run", "my-method", "seed=3", "--config", str(config), "--out", str(out)]) == 0
    record = json.loads((out / "result.json").read_text())
    assert record["method"] == "my-method" and record["entry"] == "fit"
    assert record["config"] == {"rows": 16, "noise": 0.0, "solver": "normal", "seed": 3}  # file, then items
    assert record["results"]["weights"] == pytest.approx([2.0, -1.0], abs=1e-9)  # noise 0: exact up to rounding
    assert (out / "weights.txt").is_file()
    assert main(["run", "my-method:fit", "--out", str(out)]) == 0  # its own run folder may be reused


@pytest.mark.parametrize("argv, match", [
    (["run", "my-method", "rows=many"], "option rows must be int"),
    (["run", "my-method", "solver=qr"], "option solver must be one of ['lstsq', 'normal']"),
    (["run", "my-method", "depth=3"], "has no option(s) ['depth']"),
    (["run", "my-method:other"], "has no run entry 'other'"),
    (["run", "pica"], "nothing to run on your own data"),
    (["run", "my-method", "rows"], "takes KEY=VALUE"),
    (["run"], "rankwise run --list"),
])
def test_bad_input_is_refused_before_any_work(registered, tmp_path, capsys, argv, match):
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_a_folder_with_a_users_files_is_refused(registered, tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["run", "my-method", "--out", str(tmp_path)]) == 2
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_list_names_the_entries_and_their_options(registered, capsys):
    assert main(["run", "--list"]) == 0
    assert "my-method:fit" in capsys.readouterr().out
