"""LA-LoRA's federated job on Flower: the server mean, the loopback processes engine, the plan's refusals, the CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rankwise.adapters.la_lora import LocalDPConfig, local_round
from rankwise.errors import InvalidInputError
from rankwise.training.federated import FederatedConfig, plan
from rankwise.training.federated.job import run_federated
from rankwise.training.federated.flower import client_seed
from rankwise.training.federated.models import adapted_classifier
from rankwise.training.federated.partition import dirichlet_partition, iid_partition
from peft_loading import logits_both_ways
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("la-lora")

BUILD = {"base": {"tiny_bert": {"seed": 0, "hidden_size": 16, "num_layers": 1}}, "num_labels": 3,
         "adapter": {"rank": 2, "targets": ["query", "value"]}}


def _data(n: int = 40, t: int = 6):
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(n, t, dtype=torch.long)
    mask[::4, 4:] = 0
    return {"input_ids": torch.randint(0, 500, (n, t), generator=g), "attention_mask": mask,
            "labels": torch.randint(0, 3, (n,), generator=g)}


def _config(**kw) -> FederatedConfig:
    local = LocalDPConfig(arm="la-lora", local_steps=2, batch_size=4, lr=0.2, deterministic_noise=True)  # reruns compared
    return FederatedConfig(**{"rounds": 1, "local": local, "epsilon": 8.0, "delta": 1e-3, **kw})


def test_server_state_is_the_mean_of_the_sampled_clients():
    model, data = adapted_classifier(**BUILD), _data()
    parts = iid_partition(40, 3, seed=0)
    config = _config(clients_per_round=2, seed=7)
    result = run_federated(model, data, parts, config)
    chosen = result.plan.schedule[0]
    assert len(chosen) == 2 and result.rounds[0]["clients"] == 2
    loss, start = model.sample_loss(), model.tensors()
    locals_ = [local_round(loss, start, model.roles, {k: v[parts[i]] for k, v in data.items()}, config.local,
                           result.plan.client(i).noise_multiplier, 1, client_seed(config.seed, i))[0] for i in chosen]
    for name in model.names:
        expected = torch.stack([p[name].double() for p in locals_]).mean(0).float()
        torch.testing.assert_close(result.parameters[name], expected, rtol=0, atol=0)
    assert not torch.equal(result.parameters[model.names[1]], start[model.names[1]])  # B moved
    assert torch.equal(model.tensors()[model.names[0]], start[model.names[0]])  # the caller's model is left as it was


def test_two_clients_and_server_on_loopback_processes_equal_the_inprocess_run():
    model, data = adapted_classifier(**BUILD), _data()
    parts = iid_partition(40, 2, seed=1)
    config = _config(rounds=2)
    here = run_federated(model, data, parts, config)
    there = run_federated(model, data, parts, dataclasses.replace(config, engine="processes"),
                          builder=("rankwise.training.federated.models:adapted_classifier", BUILD))
    assert there.engine == "processes" and len(there.rounds) == 2
    for name in model.names:
        torch.testing.assert_close(there.parameters[name], here.parameters[name], rtol=0, atol=0)


def test_privacy_plan_counts_every_local_step_and_meets_the_target():
    config = _config(rounds=6, clients_per_round=2, seed=3, local=LocalDPConfig(local_steps=5, batch_size=4))
    job = plan(config, [20, 30, 40])
    for c in job.clients:
        assert c.steps == 5 * c.rounds == 5 * sum(c.partition in s for s in job.schedule)
        assert c.sample_rate == 4 / c.examples
        if c.steps:
            assert 0.95 * 8.0 <= c.epsilon <= 8.0
    assert sum(len(s) for s in job.schedule) == 12


def test_bad_jobs_are_refused_before_any_work():
    sizes = [20, 30]
    with pytest.raises(InvalidInputError, match="no training examples"):
        plan(_config(), [20, 0])
    with pytest.raises(InvalidInputError, match="fewer examples"):
        plan(_config(), [3, 30])
    with pytest.raises(InvalidInputError, match="cannot be reached"):
        plan(_config(epsilon=0.001, delta=1e-3), sizes)
    with pytest.raises(InvalidInputError, match="exactly one"):
        plan(_config(noise_multiplier=1.0), sizes)
    with pytest.raises(InvalidInputError, match="below 1/n"):
        plan(_config(delta=0.1), sizes)
    with pytest.raises(InvalidInputError, match="clients_per_round"):
        plan(_config(clients_per_round=3), sizes)
    with pytest.raises(InvalidInputError, match="builder"):
        run_federated(adapted_classifier(**BUILD), _data(), iid_partition(40, 2), _config(engine="processes"))
    with pytest.raises(InvalidInputError, match="at least 5 each"):
        dirichlet_partition(torch.zeros(8, dtype=torch.long), 2, 0.5, min_size=5)
    with pytest.raises(InvalidInputError, match="fewer than 5"):  # possible in total, but every draw starves a client
        dirichlet_partition(torch.zeros(11, dtype=torch.long), 2, 0.001, min_size=5)


def test_dirichlet_partition_is_disjoint_complete_and_skewed():
    labels = torch.arange(600) % 6
    parts = dirichlet_partition(labels, 5, 0.1, min_size=16, seed=0)
    allidx = torch.cat(parts).sort().values
    assert torch.equal(allidx, torch.arange(600)) and min(len(p) for p in parts) >= 16
    shares = [float(torch.bincount(labels[p], minlength=6).max()) / len(p) for p in parts]
    assert max(shares) > 0.5  # label skew: some client is dominated by one class (IID would give ~1/6)


@pytest.mark.real_model
def test_finetune_la_lora_writes_a_peft_folder_with_the_same_outputs(tmp_path):
    from rankwise.cli import main

    out = tmp_path / "run"
    assert main(["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2",
                 "--targets", "query,value", "--top-k-layers", "1", "--procedure", "la-lora",
                 "--procedure-option", "clients=3", "--procedure-option", "rounds=2", "--procedure-option", "local_steps=2",
                 "--procedure-option", "epsilon=8", "--batch-size", "4", "--lr", "0.5", "--seq-len", "16",
                 "--train-examples", "60", "--eval-examples", "16", "--checkpoint-every", "0", "--out", str(out)]) == 0
    assert json.loads((out / "privacy.json").read_text())["noise_source"] == "OS entropy, not recorded"  # the default
    a, b, head_only, ours = logits_both_ways(out / "adapter")
    assert_rounding_close(a, b, ours)
    assert (a - head_only).abs().max() > 1e-3


@pytest.mark.real_model
def test_finetune_la_lora_processes_engine_equals_in_process(tmp_path):
    # the command line's model is rebuilt in each client process (`_builder`): the same trained adapter, bit for bit.
    # The client processes run one thread each (federated_worker), so the in-process run gets one thread too
    # (--threads 1): matmuls split over another thread count round differently.
    from safetensors.torch import load_file

    from rankwise.cli import main

    def run(engine: str):
        out = tmp_path / engine
        assert main(["--threads", "1", "finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2",
                     "--targets", "query,value", "--top-k-layers", "1", "--procedure", "la-lora",
                     "--procedure-option", "clients=2", "--procedure-option", "rounds=1",
                     "--procedure-option", "local_steps=1", "--procedure-option", "epsilon=8",
                     "--procedure-option", f"engine={engine}", "--procedure-option", "deterministic_noise=True",
                     "--batch-size", "4", "--lr", "0.5", "--seq-len", "16",
                     "--train-examples", "24", "--eval-examples", "8", "--checkpoint-every", "0", "--out", str(out)]) == 0
        return load_file(out / "adapter" / "adapter_model.safetensors")

    threads = torch.get_num_threads()
    try:
        here, there = run("inprocess"), run("processes")
    finally:
        torch.set_num_threads(threads)  # --threads is process-wide: the rest of the suite keeps its own
    assert here.keys() == there.keys() and all(torch.equal(here[k], there[k]) for k in here)


def test_finetune_la_lora_bad_options_are_clear_errors(tmp_path, capsys):
    from rankwise.cli import main

    base = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2",
            "--top-k-layers", "1", "--train-examples", "24", "--eval-examples", "8", "--seq-len", "8",
            "--checkpoint-every", "0", "--procedure", "la-lora"]
    assert main([*base, "--out", str(tmp_path / "a"), "--procedure-option", "colour=blue"]) == 2
    assert "no option(s) ['colour']" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--procedure-option", "arm=fedsa"]) == 2
    assert "arm must be one of" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "c"), "--procedure-option", "clients=6", "--batch-size", "8"]) == 2
    assert "cannot give 6 clients at least 8 each" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "d"), "--procedure-option", "epsilon=0.001", "--batch-size", "4"]) == 2
    assert "cannot be reached" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "e"), "--procedure-option", "rounds=two"]) == 2
    assert "rounds must be int" in capsys.readouterr().err


def test_a_client_failure_stops_the_job_with_its_error():
    from rankwise.errors import NumericalError

    model, data = adapted_classifier(**BUILD), _data()
    local = LocalDPConfig(arm="dp-lora", local_steps=2, batch_size=4, lr=1e38, clip=1e30)
    with pytest.raises(NumericalError, match="non-finite"):
        run_federated(model, data, iid_partition(40, 2), _config(local=local, epsilon=None, noise_multiplier=0.0))


def test_cli_builder_rebuilds_the_command_line_model():
    from rankwise.training.federated.driver import client_builder as _builder

    class Task:
        num_labels = 12

    run_config = {"model": "minilm-l6", "rank": 4, "targets": "query, value", "targets_regex": None, "top_k_layers": 1,
                  "option lora_alpha": 8.0}
    target, kwargs = _builder(run_config, Task())
    assert target == "rankwise.training.federated.models:adapted_classifier"
    assert kwargs == {"base": {"embedded": "minilm-l6"}, "num_labels": 12,
                      "adapter": {"rank": 4, "targets": ["query", "value"], "top_k_layers": 1, "options": {"lora_alpha": 8.0}}}
