"""The la-lora reproduction's arms (`repro.la_lora.arms`): the controls run through the same federated DP loop, the
head-only one trains only the head, the non-private one has no clipping or noise, the LoRA arms leave the
pre-trained head untouched, and bad arms are refused before any work."""

import math

import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.models import tiny_bert
from rankwise.repro.la_lora.arms import HEAD_ONLY, NON_PRIVATE, HeadOnlyDPConfig, Runner, RunSpec, job
from rankwise.repro.la_lora.features import TopTail, cache_inputs, pooled_features

pytestmark = pytest.mark.method("la-lora")

SPEC = RunSpec(rounds=2, clients_per_round=2, local_steps=2, batch=4, clip=1.0, delta=1e-3)
QV = ("attention.self.query", "attention.self.value")


def _runner():
    model = tiny_bert(seed=0, num_layers=3)
    gen = torch.Generator().manual_seed(0)
    feats = {}
    for split, n in (("train", 24), ("val", 8), ("test", 8)):
        ids = torch.randint(1000, 5000, (n, 6), generator=gen)
        feats[split] = {**cache_inputs(model, ids, torch.ones_like(ids), top=2), "labels": torch.arange(n) % 3}
    layers = model.encoder.layer[-2:]
    torch.manual_seed(0)
    head = nn.Linear(32, 3).requires_grad_(False)  # the "public" head
    off = TopTail(layers, head, 2, 2.0, QV)
    pooled = {k: pooled_features(off, v) for k, v in feats.items()}
    parts = [torch.arange(0, 12), torch.arange(12, 24)]
    return Runner(layers, head, 2, QV, feats, pooled, parts, SPEC), head


def test_the_controls_run_through_the_same_federation():
    runner, head = _runner()
    before = head.weight.clone()
    lora = runner.run("la-lora", 8.0, 0.5, 0)
    assert all(n.endswith((".A", ".B")) for n in lora["params"]) and lora["eps"] <= 8.0 * (1 + 1e-6)
    ho = runner.run(HEAD_ONLY, 8.0, 0.5, 0)
    assert sorted(ho["params"]) == ["head.bias", "head.weight"] and ho["eps"] <= 8.0 * (1 + 1e-6)
    assert not torch.equal(ho["params"]["head.weight"], before)  # the head-only arm trains the head ...
    assert torch.equal(head.weight, before)  # ... from a copy of the public head, which no arm changes
    np_run = runner.run(NON_PRIVATE, None, 0.1, 0)
    assert np_run["sigma"] == [0.0, 0.0] and math.isinf(np_run["eps"])
    score = runner.score(HEAD_ONLY, 8.0, 0.5, 0, "val")
    assert 0.0 <= score <= 1.0 and runner.runs[(HEAD_ONLY, 8.0, 0.5, 0)]["scores"] == {"val": score}  # lazily


def test_same_seed_same_run():
    a, _ = _runner()
    b, _ = _runner()
    ra, rb = a.run("rolora", 8.0, 0.5, 3), b.run("rolora", 8.0, 0.5, 3)
    assert all(torch.equal(ra["params"][k], rb["params"][k]) for k in ra["params"])


def test_jobs_of_each_arm():
    np_job = job(NON_PRIVATE, None, 0.1, 0, SPEC)
    assert np_job.epsilon is None and np_job.noise_multiplier == 0.0 and math.isinf(np_job.local.clip)
    ho_job = job(HEAD_ONLY, 3.0, 0.1, 0, SPEC)
    assert isinstance(ho_job.local, HeadOnlyDPConfig) and ho_job.epsilon == 3.0 and ho_job.local.clip == 1.0
    assert job("ffa-lora", 1.0, 0.1, 0, SPEC).local.arm == "ffa-lora"
    with pytest.raises(InvalidInputError, match="unknown la-lora reproduction arm"):
        job("sgd", 1.0, 0.1, 0, SPEC)
    with pytest.raises(InvalidInputError, match="only the non-private arm"):
        job("la-lora", None, 0.1, 0, SPEC)
    with pytest.raises(InvalidInputError, match="only the non-private arm"):
        job(NON_PRIVATE, 3.0, 0.1, 0, SPEC)


def test_the_head_only_round_refuses_lora_factors():
    local = HeadOnlyDPConfig(arm="dp-lora")
    local.check_roles({"head.weight": "other", "head.bias": "other"})
    with pytest.raises(InvalidInputError, match="trains no LoRA factor"):
        local.check_roles({"lora.A": "A", "lora.B": "B", "head.weight": "other"})
