"""`rankwise finetune --method full --procedure NAME` runs a procedure that trains the model's own weights (WASI,
TraDy and DFA will be such procedures); one that trains an adapter is refused with --method full, and a base one
with an adapter method, before any model is loaded.

The procedure here is a test double registered for the duration of a test: an L2 pull of every trained weight
towards its starting value (L2-SP), a real base-training procedure with one option."""

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from rankwise.cli import main
from rankwise.core.training import Procedure
from rankwise.registry import ProcedureEntry

ARGS = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--steps", "2", "--batch-size", "4",
        "--train-examples", "16", "--eval-examples", "8", "--seq-len", "16", "--checkpoint-every", "1"]


@dataclass(frozen=True)
class L2StartConfig:
    weight: float = 1.0


class L2ToStart(Procedure):
    name: ClassVar[str] = "l2-to-start"
    calls_total: ClassVar[int] = 0  # extra-loss calls over the test (the CLI builds the instance)

    def __init__(self, module: torch.nn.Module, weight: float) -> None:
        self.weight = weight
        self.start = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}

    def extra_loss(self, module: torch.nn.Module) -> torch.Tensor:
        L2ToStart.calls_total += 1
        return self.weight * sum((p - self.start[n]).square().sum() for n, p in module.named_parameters() if p.requires_grad)

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, "l2 weight": self.weight}


def build(module, task, seed, config: L2StartConfig):
    return L2ToStart(module, config.weight)


@pytest.fixture
def registered(monkeypatch):
    import rankwise.commands.finetune as finetune
    import rankwise.training.procedures as procedures

    entry = ProcedureEntry("l2-to-start", f"{__name__}:build", f"{__name__}:L2StartConfig", trains="base")
    real = procedures.procedure_entries
    monkeypatch.setattr(procedures, "procedure_entries", lambda: {**real(), entry.name: entry})
    monkeypatch.setattr(finetune, "PROCEDURES", (*finetune.PROCEDURES, entry.name))
    L2ToStart.calls_total = 0


@pytest.mark.real_model
def test_a_base_procedure_runs_with_full_fine_tuning(registered, tmp_path):
    out = tmp_path / "run"
    assert main([*ARGS, "--method", "full", "--procedure", "l2-to-start", "--procedure-option", "weight=0.5",
                 "--out", str(out)]) == 0
    assert L2ToStart.calls_total == 2  # its loss term joined both steps
    assert (out / "model" / "config.json").is_file() and not (out / "adapter").exists()
    run = json.loads((out / "checkpoint" / "trainer.json").read_text())["run"]  # what a resume is checked against
    assert run["procedure"] == "l2-to-start" and run["l2 weight"] == 0.5


def test_what_a_procedure_trains_is_checked_before_the_model_loads(registered, tmp_path, capsys, monkeypatch):
    import rankwise.models

    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main([*ARGS, "--method", "lora", "--rank", "2", "--procedure", "l2-to-start", "--out", str(tmp_path / "a")]) == 2
    assert "trains the model's own weights: it needs --method full" in capsys.readouterr().err
    assert main([*ARGS, "--method", "full", "--procedure", "lmao", "--out", str(tmp_path / "b")]) == 2
    assert "trains an adapter: it needs an adapter --method, not full" in capsys.readouterr().err
    assert main([*ARGS, "--method", "full", "--procedure", "l2-to-start", "--procedure-option", "weight=heavy",
                 "--out", str(tmp_path / "c")]) == 2
    assert "option weight must be int or float" in capsys.readouterr().err
