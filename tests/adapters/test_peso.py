"""PESO's proximal terms (rankwise.adapters.peso): the card's invariants, each able to fail."""

import pytest
import torch

from rankwise.adapters import LoraConfig, add_adapter
from rankwise.adapters.peso import (
    ProximalRegularizer, Snapshot, inherit, lora_factors_of, softmax_kl, softmax_kl_quadratic,
)
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rankwise.training import LanguageModelingTask, TrainConfig, train
from rankwise.adapters.peso.procedure import PesoProcedure
from rounding import max_abs, network_tol

pytestmark = pytest.mark.method("peso")
TARGETS = ["q_proj", "v_proj", "down_proj"]


def trained_lora(seed=0, r=4, steps=3):
    """A tiny Llama with a LoRA adapter moved off its B = 0 start by a few steps (so softmax(B) is not uniform)."""
    torch.manual_seed(seed)
    model = add_adapter(tiny_llama(seed, vocab_size=64), LoraConfig(r=r, lora_alpha=8, target_modules=TARGETS))
    train(model, lm_task(seed), TrainConfig(steps=steps, batch_size=4, lr=1e-2, seed=seed))
    return model


def lm_task(seed=0):
    g = torch.Generator().manual_seed(seed)
    return LanguageModelingTask(torch.randint(0, 64, (16, 12), generator=g), torch.randint(0, 64, (4, 12), generator=g))


@pytest.mark.parametrize("kind", ["kl", "l2"])
def test_term_and_gradient_exactly_zero_at_block_start(kind):
    model = trained_lora()
    factors = lora_factors_of(model)
    reg = ProximalRegularizer(Snapshot.of(model), lam=5.0, kind=kind)
    term = reg(factors)
    term.backward()
    assert float(term.detach()) == 0.0
    assert all(torch.count_nonzero(t.grad) == 0 for ab in factors.values() for t in ab)
    # off the anchor the term and gradient are not zero (so the check above can fail)
    with torch.no_grad():
        next(iter(factors.values()))[1].mul_(1.5)
    for ab in factors.values():
        for t in ab:
            t.grad = None
    moved = reg(factors)
    moved.backward()
    assert float(moved.detach()) > 0 and any(torch.count_nonzero(t.grad) > 0 for ab in factors.values() for t in ab)


def test_softmax_kl_gradient_matches_autograd_of_the_formula():
    """The analytic backward equals autograd through the paper's formula (eps added, renormalised), in float64."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 7, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(3, 7, dtype=torch.float64, generator=g)
    eps = 1e-3  # large enough that the renormalisation matters

    def reference(x):
        p, q = torch.softmax(x.reshape(-1), 0) + eps, torch.softmax(b.reshape(-1), 0) + eps
        p, q = p / p.sum(), q / q.sum()
        return (p * (p.log() - q.log())).sum()

    ours = softmax_kl(a, b, eps)
    (g_ours,) = torch.autograd.grad(ours, a)
    (g_ref,) = torch.autograd.grad(reference(a), a)
    torch.testing.assert_close(ours, reference(a).detach(), rtol=1e-12, atol=0)
    # float64, 21 entries: the analytic and the autograd gradient differ by rounding (~1e-16); dropping a term of the
    # formula (e.g. the renormalisation after + eps) moves them by >= ~1e-4
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=network_tol(torch.float64, max_abs(g_ref), 1, a.numel()))
    assert torch.autograd.gradcheck(lambda x: softmax_kl(x, b, eps), (a,))


def test_small_delta_kl_is_the_softmax_fisher_quadratic():
    g = torch.Generator().manual_seed(2)
    v = torch.randn(4, 64, dtype=torch.float64, generator=g)
    delta = torch.randn(4, 64, dtype=torch.float64, generator=g)
    delta *= 1e-2 / delta.norm()
    kl = float(softmax_kl(v + delta, v))
    quad = float(softmax_kl_quadratic(v, delta))
    assert quad > 0 and abs(kl - quad) <= 1e-2 * quad
    big = torch.zeros_like(v)
    big[0, 0] = 4.0  # one entry moved far: outside the quadratic regime, so the check has teeth
    assert abs(float(softmax_kl(v + big, v)) - float(softmax_kl_quadratic(v, big))) > 1e-2 * float(softmax_kl_quadratic(v, big))


def test_uniform_shift_of_a_factor_leaves_its_kl_at_zero():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 32, dtype=torch.float64, generator=g)
    shifted = softmax_kl(a + 0.37, a)
    # Not ~1e-32: the two softmaxes and logs are rounded separately, so log p' - log q' carries ~eps64 * |log p'|
    # per entry and the KL (first order in that noise) is ~1e-16, positive or clamped to 0 by the sign of the noise
    # (measured 0 to 3.5e-16 across seeds). A real change of this size gives > 1e-3 (below).
    log_p = torch.log_softmax(a.reshape(-1), 0)
    assert float(shifted) <= 64 * torch.finfo(torch.float64).eps * float(log_p.abs().max())
    same_size = a + 0.37 * torch.linspace(-1, 1, a.numel(), dtype=torch.float64).reshape(a.shape)
    assert float(softmax_kl(same_size, a)) > 1e-3  # a non-uniform change of the same size is penalised


def test_only_the_latest_snapshot_enters_the_loss():
    model = trained_lora()
    factors = lora_factors_of(model)
    first = Snapshot.of(model)
    with torch.no_grad():
        for a, b in factors.values():
            b.add_(0.05)
            a.mul_(1.1)
    reg = ProximalRegularizer(first, lam=2.0)
    reg.reanchor(factors)  # stage 2 -> 3: the anchor is now the end of stage 2
    with torch.no_grad():
        for a, b in factors.values():
            b.add_(torch.linspace(0, 0.02, b.numel()).reshape(b.shape))
    value = float(reg(factors))
    with torch.no_grad():  # the stage-1 snapshot changing has no effect
        for a0, b0 in first.factors.values():
            a0.normal_()
            b0.normal_()
    assert float(reg(factors)) == value
    assert reg.anchor is not first and value > 0


def test_snapshots_are_frozen_copies_and_full_modules_are_not_regularised():
    model = trained_lora()
    embed = model.model.model.embed_tokens.weight
    embed.requires_grad_(True)  # trained fully, like the paper's embed_tokens / lm_head (modules_to_save)
    snap = Snapshot.of(model)
    factors = lora_factors_of(model)
    assert all(not t.requires_grad for ab in snap.factors.values() for t in ab)
    assert all(t.data_ptr() != s.data_ptr() for name, ab in factors.items() for t, s in zip(ab, snap.factors[name]))
    assert sorted(snap.modules) == sorted(n for n, _ in model.adapted_layers())
    assert not any("embed" in n or "lm_head" in n for n in snap.modules)
    with torch.no_grad():
        next(iter(factors.values()))[0].add_(0.1)
    reg = ProximalRegularizer(snap, lam=1.0)
    reg(factors).backward()
    assert embed.grad is None and all(not t.requires_grad or t.grad is None for ab in snap.factors.values() for t in ab)


def test_lam_zero_is_bit_equal_to_single_evolving_lora():
    start = trained_lora(seed=4)
    state = {k: v.clone() for k, v in start.adapter_state("default").items()}

    def stage(procedure_lam):
        m = add_adapter(tiny_llama(4, vocab_size=64), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
        with torch.no_grad():
            for k, v in m.adapter_state("default").items():
                v.copy_(state[k])
        proc = None
        if procedure_lam is not None:
            proc = PesoProcedure(m, ProximalRegularizer(Snapshot.of(m), lam=procedure_lam))
        train(m, lm_task(5), TrainConfig(steps=4, batch_size=4, lr=1e-2, seed=5), procedure=proc)
        return m.adapter_state("default")

    plain, lam0, lam5 = stage(None), stage(0.0), stage(50.0)
    assert all(torch.equal(plain[k], lam0[k]) for k in plain)
    assert not all(torch.equal(plain[k], lam5[k]) for k in plain)  # a positive lam does change the trajectory


def test_inherit_copies_the_previous_adapter_and_refuses_a_mismatch(tmp_path):
    prev = trained_lora()
    prev.save(tmp_path / "prev")
    here = add_adapter(tiny_llama(0, vocab_size=64), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    anchor = inherit(here, tmp_path / "prev")
    for name, (a, b) in lora_factors_of(here).items():
        assert torch.equal(a, lora_factors_of(prev)[name][0]) and torch.equal(b, anchor.factors[name][1])
    for config, what in ((LoraConfig(r=2, lora_alpha=4, target_modules=TARGETS), "r: previous 4, here 2"),
                         (LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS), "scaling"),
                         (LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]), "modules")):
        other = add_adapter(tiny_llama(0, vocab_size=64), config)
        before = {k: v.clone() for k, v in other.adapter_state("default").items()}
        with pytest.raises(InvalidInputError, match=what):
            inherit(other, tmp_path / "prev")
        assert all(torch.equal(before[k], v) for k, v in other.adapter_state("default").items())  # unchanged
    with pytest.raises(InvalidInputError, match="lam must be"):
        ProximalRegularizer(anchor, lam=-1.0)
    with pytest.raises(InvalidInputError, match="proximal must be"):
        ProximalRegularizer(anchor, lam=1.0, kind="fisher")
