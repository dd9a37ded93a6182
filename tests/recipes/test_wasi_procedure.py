"""WASI as a training procedure: what a plain loop step holds, the end-of-training model, resume, the rank search,
the analytic counts against the measured ones, bad input refused before training, and the CLI on MiniLM."""

import json

import pytest
import torch
from torch import nn

from rankwise.cli import main
from rankwise.core.training import TrainConfig, train
from rankwise.core.training.tensor_tasks import TensorClassificationTask
from rankwise.errors import RankwiseError
from rankwise.models.vision import tiny_vit_stand_in
from rankwise.recipes.wasi import WasiLinear, build, find_targets
from rankwise.training.image_tasks import BackboneClassifier
from rankwise.training.procedures import check_procedure_options

pytestmark = pytest.mark.method("wasi")


def _model(seed=0):
    torch.manual_seed(seed)
    vit, _ = tiny_vit_stand_in(seed=0, dim=16, depth=2, heads=2, mlp_dim=32)
    return BackboneClassifier(vit, 3)


def _task(n=48):
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 3, (n,), generator=g)
    return TensorClassificationTask("random images", x, y, x[:16], y[:16])


def test_build_swaps_the_mlp_linears_and_freezes_the_rest():
    module, task = _model(), _task()
    procedure = build(module, task, 0, epsilon=0.8)
    names = sorted(procedure.layers)
    assert names == [f"model.blocks.{b}.mlp.{f}" for b in range(2) for f in ("fc1", "fc2")]
    assert all(isinstance(module.get_submodule(n), WasiLinear) for n in names)
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trained == {f"{n}.{p}" for n in names for p in ("L", "R", "bias")} | {"head.weight", "head.bias"}
    assert not any(n.endswith("weight") and "mlp" in n for n, _ in module.named_parameters())  # no dense W


def test_a_plain_loop_step_holds_only_the_tucker_factors_and_l_r():
    module, task = _model(), _task()
    procedure = build(module, task, 0, epsilon=0.8)
    batch = task.batch(torch.arange(8))
    saved = {}
    for name, layer in procedure.layers.items():  # what autograd saves inside each WASI layer's own forward
        own = []
        layer.register_forward_pre_hook(lambda m, a, own=own: m.__dict__.setdefault("_ctx", _Catch(own)).enter())
        layer.register_forward_hook(lambda m, a, o: m.__dict__.pop("_ctx").exit())
        saved[name] = own
    procedure.before_micro_batch(0, 0)
    task.loss(module, batch).backward()
    for name, layer in procedure.layers.items():
        allowed = {id(layer.L), id(layer.R), *map(id, layer.activation.bases)}
        rest = [t for t in saved[name] if id(t) not in allowed]
        assert len(rest) == 1 and tuple(rest[0].shape) == layer.activation_ranks, name
    memory = procedure.analytic_memory(batch)
    measured = sum(t.numel() * 4 for ts in saved.values() for t in ts
                   if not any(t is getattr(layer, k) for layer in procedure.layers.values() for k in ("L", "R")))
    assert memory["activations"] == measured
    assert memory["weights"] == sum(4 * (p.numel()) for layer in procedure.layers.values() for p in layer.parameters())
    assert memory["vanilla_activations"] > memory["activations"] and memory["dense_master"] == 0
    flops = procedure.analytic_flops(batch)
    assert flops["forward"] > 0 and flops["vanilla_backward"] > 0


class _Catch:
    def __init__(self, into):
        self.ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: into.append(t) or t, lambda t: t)

    def enter(self):
        self.ctx.__enter__()

    def exit(self):
        self.ctx.__exit__(None, None, None)


@pytest.mark.parametrize("variant", ["low-memory", "paper"])
def test_training_ends_with_plain_linears_computing_the_compressed_model(variant):
    module, task = _model(), _task()
    procedure = build(module, task, 0, epsilon=0.8, variant=variant)
    result = train(module, task, TrainConfig(steps=3, batch_size=8, lr=0.05), procedure=procedure)
    assert result.steps == 3
    for name, layer in procedure.layers.items():
        linear = module.get_submodule(name)
        assert type(linear) is nn.Linear
        torch.testing.assert_close(linear.weight, layer.dense_weight())
        assert torch.linalg.matrix_rank(linear.weight) <= layer.rank


@pytest.mark.parametrize("variant", ["low-memory", "paper"])
def test_resume_repeats_the_uninterrupted_run(tmp_path, variant):
    config = TrainConfig(steps=4, batch_size=8, lr=0.05, checkpoint_every=2, seed=1)

    def fresh():
        module = _model()
        return module, build(module, _task(), 3, epsilon=0.8, variant=variant)

    whole_model, whole_proc = fresh()
    whole = train(whole_model, _task(), config, procedure=whole_proc)
    model, proc = fresh()
    train(model, _task(), config, out_dir=tmp_path, stop_after=2, procedure=proc)
    again, again_proc = fresh()
    resumed = train(again, _task(), config, out_dir=tmp_path, procedure=again_proc)
    assert resumed.losses == whole.losses
    for (n, a), (_, b) in zip(whole_model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_the_budget_search_fixes_ranks_within_the_budget():
    module, task = _model(), _task()
    loose = build(_model(), task, 0, budget_mb=1.0, calibration_examples=8)
    tight = build(module, task, 0, budget_mb=2e-3, calibration_examples=8, epsilons=(0.3, 0.6, 0.9))
    chosen = [tight.search[n][i] for n, i in tight.choice.items()]
    assert sum(o.bytes for o in chosen) <= 2e-3 * 2**20
    assert all(layer.activation_ranks == tight.search[n][tight.choice[n]].ranks for n, layer in tight.layers.items())
    best = sum(min(o.perplexity for o in options) for options in loose.search.values())
    assert sum(loose.search[n][i].perplexity for n, i in loose.choice.items()) == best  # room for the best options
    assert all(p.grad is None for p in module.parameters())  # calibration is not a training step


@pytest.mark.parametrize("options, message", [
    ({"epsilon": 0.0}, r"\(0, 1\]"),
    ({"epsilon": 1.5}, r"\(0, 1\]"),
    ({"activation_epsilon": -0.2}, r"\(0, 1\]"),
    ({"budget_mb": 1e-6, "calibration_examples": 8}, "fits no choice"),
    ({"targets": "norm1"}, "LayerNorm: WASI replaces nn.Linear"),
    ({"targets": "nothing_here"}, "names no module"),
])
def test_bad_input_is_refused_before_training(options, message):
    module = _model()
    before = {n: p.detach().clone() for n, p in module.state_dict().items()}
    with pytest.raises(RankwiseError, match=message):
        build(module, _task(), 0, **options)
    assert all(torch.equal(before[n], p) for n, p in module.state_dict().items())  # nothing was swapped


def test_a_model_without_mlp_linears_is_refused():
    with pytest.raises(RankwiseError, match="no layer WASI can train"):
        find_targets(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Linear(2, 2)))


def test_the_cli_checks_options_before_any_model_loads():
    with pytest.raises(RankwiseError, match=r"\(0, 1\]"):
        check_procedure_options("wasi", {"epsilon": 2.0})
    with pytest.raises(RankwiseError, match="variant"):
        check_procedure_options("wasi", {"variant": "dense"})


@pytest.mark.real_model
def test_finetune_full_with_the_wasi_procedure_on_minilm(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--steps", "2", "--batch-size", "4",
            "--train-examples", "16", "--eval-examples", "8", "--seq-len", "16", "--checkpoint-every", "1",
            "--method", "full", "--procedure", "wasi", "--procedure-option", "epsilon=0.7",
            "--procedure-option", "targets=layer.5.intermediate.dense,layer.5.output.dense", "--out", str(out)]
    assert main(args) == 0
    assert (out / "model" / "config.json").is_file() and (out / "model" / "model.safetensors").is_file()
    run = json.loads((out / "checkpoint" / "trainer.json").read_text())["run"]
    assert run["procedure"] == "wasi" and run["wasi epsilon"] == 0.7
    ranks = run["wasi weight ranks"]
    assert set(ranks) == {"model.encoder.layer.5.intermediate.dense", "model.encoder.layer.5.output.dense"}
    assert all(0 < k < 384 for k in ranks.values())
    from rankwise.models import load_model

    saved, _ = load_model(str(out / "model"))  # a plain BERT folder: the WASI layers were merged back
    w = saved.encoder.layer[5].intermediate.dense.weight
    assert torch.linalg.matrix_rank(w) == ranks["model.encoder.layer.5.intermediate.dense"]
