"""The `dfa` procedure on a user's module: bad input refused before training, the head-only warm-up then matching,
exact resume, the plain model left after training, and `finetune --method full --procedure dfa` on MiniLM."""

import json

import pytest
import torch
from torch import nn

from rankwise.cli import main
from rankwise.core.training import TrainConfig, train
from rankwise.core.training.tensor_tasks import TensorClassificationTask
from rankwise.errors import InvalidInputError, RankwiseError
from rankwise.recipes.dfa import DfaConfig, build
from rankwise.training.procedures import check_procedure_options

pytestmark = pytest.mark.method("dfa-feedback-matching")


class Net(nn.Module):
    def __init__(self, depth=3, width=12, inputs=10, classes=4):
        super().__init__()
        torch.manual_seed(0)
        layers, d = [], inputs
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU()]
            d = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(x))


def _task(n=48, inputs=10, classes=4):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, inputs, generator=g), torch.randint(0, classes, (n,), generator=g)
    return TensorClassificationTask("toy", x, y, x[:8], y[:8])


class ConvNet(nn.Module):
    """Convolutions and an output layer: no hidden nn.Linear for DFA."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.head = nn.Linear(40, 4)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x[:, None])).flatten(1))


class Unused(Net):
    def __init__(self):
        super().__init__()
        self.spare = nn.Linear(12, 12)  # registered, never called


@pytest.mark.parametrize("model, options, message", [
    (ConvNet(), {}, "found no eligible layer"),
    (Net(), {"layers": "body.1"}, "is a ReLU: DFA trains nn.Linear layers only"),
    (ConvNet(), {"layers": "conv"}, "is a Conv1d: DFA trains nn.Linear layers only"),
    (Net(), {"layers": "body.9"}, "is not a module of the model"),
    (Net(), {"layers": "head"}, "is the output layer"),
    (Net(), {"head": "body.1"}, "the output layer must be an nn.Linear"),
    (Unused(), {"layers": "body.0,spare"}, "not reached by the task's loss"),
])
def test_bad_layers_are_refused_before_training(model, options, message):
    with pytest.raises(InvalidInputError, match=message):
        build(model, _task(), 0, **options)


def test_a_frozen_layer_asked_for_and_a_broken_chain_are_refused():
    model = Net()
    model.body[0].requires_grad_(False)
    with pytest.raises(InvalidInputError, match="is frozen"):
        build(model, _task(), 0, layers="body.0")
    narrow = Net()
    narrow.body[0], narrow.body[2] = nn.Linear(10, 8), nn.Linear(8, 12)
    with pytest.raises(InvalidInputError, match="no DFA layer feeds the output layer"):
        build(narrow, _task(), 0, layers="body.0")  # 8 outputs: it cannot feed the 12-input head
    assert build(narrow, _task(), 0, layers="body.0", matching="none").chain == []


@pytest.mark.parametrize("options, message", [
    ({"weight_decay": -1e-3}, "weight_decay must be a finite number >= 0"),
    ({"match_depth": 0}, "match_depth must be at least 1"),
    ({"matching": "both"}, "must be one of"),
    ({"head_steps": -1}, "head_steps must be >= 0"),
    ({"layers": ""}, "layers takes module names"),
])
def test_bad_options_are_refused_before_any_model(options, message):
    with pytest.raises(RankwiseError, match=message):
        check_procedure_options("dfa", options)


def test_the_head_trains_alone_first_then_matching_and_dfa_start():
    model, task = Net(), _task()
    proc = build(model, task, 0, head_steps=3, matching="fwm")
    assert not proc.matched
    hidden0 = [layer.weight.detach().clone() for layer in proc.dfa_layers]
    head0 = model.head.weight.detach().clone()
    train(model, task, TrainConfig(steps=3, batch_size=8, lr=0.05), procedure=build_again(proc))
    assert all(torch.equal(layer.weight.detach(), w) for layer, w in zip(proc.dfa_layers, hidden0))
    assert not torch.equal(model.head.weight.detach(), head0)


def build_again(proc):
    """The loop calls end_of_training at its last step; keep the procedure wrapped for inspection."""
    proc.end_of_training = lambda module: None
    return proc


def test_matching_happens_after_the_warm_up_on_the_fitted_head():
    model, task = Net(), _task()
    proc = build_again(build(model, task, 0, head_steps=2, matching="fwm"))
    train(model, task, TrainConfig(steps=2, batch_size=8, lr=0.05, warmup_ratio=0.0), procedure=proc)
    assert not proc.matched
    proc.before_micro_batch(2, 0)  # the first step after the warm-up matches on the head as fitted
    assert proc.matched and proc.hub.hidden_trains
    torch.testing.assert_close(proc.dfa_layers[-1].feedback, proc.head_linear.weight.detach().T, rtol=0, atol=0)
    assert all(abs(1 - v) <= 1e-5 for v in proc.weight_alignment().values())


def test_resume_repeats_the_uninterrupted_run(tmp_path):
    def run(out, stop=None):
        model, task = Net(), _task()
        proc = build(model, task, 0, head_steps=1, weight_decay=1e-2)
        train(model, task, TrainConfig(steps=4, batch_size=8, lr=0.05, checkpoint_every=1), out_dir=out,
              stop_after=stop, procedure=proc)
        return model

    whole = run(tmp_path / "a")
    run(tmp_path / "b", stop=2)
    resumed = run(tmp_path / "b")
    for (n, p), (_, q) in zip(whole.named_parameters(), resumed.named_parameters()):
        assert torch.equal(p, q), n


def test_after_training_the_model_is_plain_and_its_state_dict_loads_into_a_fresh_one():
    model, task = Net(), _task()
    keys = set(model.state_dict())
    proc = build(model, task, 0)
    train(model, task, TrainConfig(steps=2, batch_size=8, lr=0.05), procedure=proc)
    assert set(model.state_dict()) == keys
    fresh = Net()
    fresh.load_state_dict(model.state_dict())
    x = task.batch(torch.arange(8))["inputs"]
    torch.testing.assert_close(fresh(x), model(x))
    describe = proc.describe()
    assert describe["fused_activations"] == {"body.0": "relu", "body.2": "relu", "body.4": "relu"}
    json.dumps(describe)


def test_other_parameters_are_frozen_during_training_and_unfrozen_after():
    class WithNorm(Net):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(12)

        def forward(self, x):
            return self.head(self.norm(self.body(x)))

    model, task = WithNorm(), _task()
    proc = build(model, task, 0, matching="none")
    assert not model.norm.weight.requires_grad
    assert {id(p) for p in model.parameters() if p.requires_grad} == (
        {id(p) for layer in proc.dfa_layers for p in layer.parameters()} | {id(p) for p in model.head.parameters()})
    proc.end_of_training(model)
    assert model.norm.weight.requires_grad


def test_the_config_is_accepted_whole():
    proc = build(Net(), _task(), 0, DfaConfig(matching="none", weight_decay=0.0))
    assert proc.config.matching == "none" and proc.hub.weight_decay == 0.0


@pytest.mark.real_model
def test_finetune_full_with_the_dfa_procedure_on_minilm(tmp_path):
    out = tmp_path / "run"
    args = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--steps", "2", "--batch-size", "4",
            "--train-examples", "16", "--eval-examples", "8", "--seq-len", "16", "--checkpoint-every", "1",
            "--method", "full", "--procedure", "dfa", "--procedure-option", "match_depth=2", "--out", str(out)]
    assert main(args) == 0
    assert (out / "model" / "config.json").is_file() and (out / "head.safetensors").is_file()
    run = json.loads((out / "checkpoint" / "trainer.json").read_text())["run"]
    assert run["procedure"] == "dfa" and run["matching"] == "fwm" and len(run["matched_chain"]) == 2
    assert "model.pooler.dense" not in run["dfa_layers"]  # its output is unused by the mean-pooled head
    assert any(name.endswith("attention.self.query") for name in run["dfa_layers"])
