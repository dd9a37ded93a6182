"""GuardSpace's reproduction baselines: the Safe-LoRA-like post-hoc projection and the same-rank control projectors;
and its fine-tuning task over the cached prefix states."""

import copy

import pytest
import torch

from rankwise.adapters import LoraConfig, add_adapter, find_targets
from rankwise.adapters.guardspace import GuardSpaceConfig
from rankwise.adapters.safe_projection import safe_project
from rankwise.core.calibration import collect_second_moments
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rankwise.core.padding import pad_batch
from rankwise.repro.guardspace.arms import CachedTask, protected_bases, random_bases, unrelated_bases
from rankwise.repro.guardspace.data import with_answer
from rankwise.training.frozen_prefix import IGNORE_INDEX, FrozenPrefixRunner
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("guardspace")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EPS32 = torch.finfo(torch.float32).eps


def _ids(seed, shape):
    return torch.randint(0, 2000, shape, generator=torch.Generator().manual_seed(seed))


def _protected():
    return [_ids(1, (1, 12)), _ids(2, (1, 12))]  # 24 tokens < 64 = hidden size: exact null spaces exist


def _trained_lora(base):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS)
    names = find_targets(base, config)
    stats = collect_second_moments(base, names, _protected(), use_cache=False)
    model = add_adapter(copy.deepcopy(base), config)
    with torch.no_grad():  # a "trained" LoRA: B is no longer zero
        g = torch.Generator().manual_seed(4)
        for adapter in model.adapters_of("default").values():
            adapter.B.copy_(0.05 * torch.randn(adapter.B.shape, generator=g))
    return model, stats


def test_safe_projection_restores_protected_logits_and_projects_the_delta():
    base = tiny_llama(vocab_size=2048)
    model, stats = _trained_lora(base)
    bases = protected_bases(stats, threshold=0.0)
    adapters = model.adapters_of("default")
    before = {n: a.delta_weight().double() for n, a in adapters.items()}
    seq = _protected()[0]
    with torch.no_grad():
        assert (model(input_ids=seq).logits - base(input_ids=seq).logits).abs().max() > 1e-3  # not vacuous
    records = safe_project(adapters, bases)
    for name, adapter in adapters.items():
        Q = bases[name]
        expected = (before[name] @ Q.T) @ Q
        scale = before[name].abs().max().item()
        torch.testing.assert_close(adapter.delta_weight().double(), expected, rtol=0, atol=64 * EPS32 * scale)
        sim = (expected.norm() / before[name].norm()).item()
        assert records[name].projected
        assert abs(records[name].similarity - sim) <= 64 * EPS32  # before[] was formed in float32
    with torch.no_grad():
        for seq in _protected():
            expected = base(input_ids=seq).logits
            assert_rounding_close(model(input_ids=seq).logits, expected, base)


def test_safe_projection_threshold_selects_layers():
    base = tiny_llama(vocab_size=2048)
    model, stats = _trained_lora(base)
    adapters = model.adapters_of("default")
    A = {n: a.A.detach().clone() for n, a in adapters.items()}
    records = safe_project(adapters, protected_bases(stats, threshold=0.0), threshold=0.0)  # sim < 0 never holds
    assert not any(r.projected for r in records.values())
    assert all(torch.equal(a.A, A[n]) for n, a in adapters.items())


def test_safe_projection_bad_input():
    base = tiny_llama(vocab_size=2048)
    model, stats = _trained_lora(base)
    adapters = model.adapters_of("default")
    bases = protected_bases(stats, threshold=0.0)
    with pytest.raises(InvalidInputError, match="threshold"):
        safe_project(adapters, bases, threshold=1.5)
    with pytest.raises(InvalidInputError, match="no projector basis"):
        safe_project(adapters, {})
    with pytest.raises(InvalidInputError, match="basis must be"):
        safe_project(adapters, {n: q[:, :3] for n, q in bases.items()})
    guarded = add_adapter(copy.deepcopy(base), GuardSpaceConfig(r=4, target_modules=TARGETS), statistics=stats)
    with pytest.raises(InvalidInputError, match="plain LoRA"):
        safe_project(guarded.adapters_of("default"), bases)
    pissa = add_adapter(copy.deepcopy(base), LoraConfig(r=4, init="pissa", target_modules=TARGETS))
    with pytest.raises(InvalidInputError, match="PiSSA"):
        safe_project(pissa.adapters_of("default"), bases)


def test_control_projectors_have_the_same_rank_and_are_orthonormal():
    base = tiny_llama(vocab_size=2048)
    names = find_targets(base, GuardSpaceConfig(r=4, target_modules=TARGETS))
    stats = collect_second_moments(base, names, _protected(), use_cache=False)
    other = collect_second_moments(base, names, [_ids(8, (1, 12)), _ids(9, (1, 12))], use_cache=False)
    guard = protected_bases(stats, threshold=0.0)
    dims = {n: q.size(0) for n, q in guard.items()}
    for controls in (unrelated_bases(other, dims), random_bases(dims, {n: s.dim for n, s in stats.items()}, seed=0)):
        for n, q in controls.items():
            assert q.shape == guard[n].shape
            eye = torch.eye(q.size(0), dtype=torch.float64)
            torch.testing.assert_close(q @ q.T, eye, rtol=0, atol=1e3 * torch.finfo(torch.float64).eps)
    # the unrelated control annihilates the *other* prompts' inputs, not the protected ones (it is specific)
    for n, q in unrelated_bases(other, dims).items():
        X = torch.linalg.eigh(other[n].covariance())[0]
        assert X.numel() == q.size(1)
        assert not torch.allclose(q.T @ q, guard[n].T @ guard[n], atol=1e-3)


def test_cached_task_batches_the_sequences_answers():
    model = tiny_llama(seed=0, vocab_size=2000, num_layers=2)
    runner = FrozenPrefixRunner(model, start=1)
    shapes = ((3, 4), (5, 2), (2, 6))  # (prompt, answer) lengths
    seqs = [with_answer(_ids(i, (p,)).tolist(), _ids(10 + i, (a,)).tolist()) for i, (p, a) in enumerate(shapes)]
    hs = runner.prefix([q.ids for q in seqs])
    task = CachedTask(runner, hs, seqs)
    batch = task.batch(torch.tensor([2, 0]))
    assert task.num_train == 3 and task.name == "wiki-topics+overwrite" and task.evaluate(model) == {}
    assert torch.equal(batch["h"], pad_batch([hs[2], hs[0]], 0.0))
    assert torch.equal(batch["targets"], pad_batch([seqs[2].targets, seqs[0].targets], IGNORE_INDEX))
    assert int((batch["targets"] != IGNORE_INDEX).sum()) == 6 + 4  # the answers' tokens only
    assert torch.equal(task.loss(model, batch), runner.loss(batch["h"], batch["targets"]))
