"""GuardSpace's invariants (method card guardspace.md): projector algebra, exact split, identity at init, protected
outputs unchanged after training, update confined to the null space, PEFT export, bad input."""

import copy

import pytest
import torch

from rankwise.adapters import add_adapter, find_targets, load_adapter
from rankwise.adapters.guardspace import GuardSpaceConfig
from rankwise.adapters.guardspace_split import RECONSTRUCTION_TOL, guarded_split, null_space_basis
from rankwise.core.calibration import SecondMoment, collect_second_moments
from rankwise.core.linalg import symmetric_eigh
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rounding import assert_rounding_close, logits_tol, network_tol

EPS64 = torch.finfo(torch.float64).eps

pytestmark = pytest.mark.method("guardspace")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _ids(seed, shape):
    return torch.randint(0, 2000, shape, generator=torch.Generator().manual_seed(seed))


def _protected():
    # 2 x 12 = 24 protected tokens < 64 = hidden size: every site's covariance has a null space
    return [_ids(1, (1, 12)), _ids(2, (1, 12))]


def _guarded(base, **kw):
    config = GuardSpaceConfig(r=4, target_modules=TARGETS, **kw)
    names = find_targets(base, config)
    stats = collect_second_moments(base, names, _protected(), use_cache=False)
    return add_adapter(copy.deepcopy(base), config, statistics=stats)


def _low_rank_inputs(d=32, n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(d, n, generator=g, dtype=torch.float64)  # n < d: C = X X^T / n has a (d - n)-dim null space
    return X, X @ X.T / n


def test_projector_is_symmetric_idempotent_and_annihilates_protected_inputs():
    X, C = _low_rank_inputs()
    Q = null_space_basis(symmetric_eigh(C), threshold=0.0)
    assert Q.size(0) == 12
    P = Q.T @ Q
    # float64, |P| <= 1, inner products of 32 terms: rounding is ~1e-15; a wrong basis is off by O(1)
    tol = network_tol(torch.float64, 1.0, 1, 32)
    torch.testing.assert_close(P, P.T, rtol=0, atol=tol)
    torch.testing.assert_close(P @ P, P, rtol=0, atol=tol)
    # eigh's null vectors lean into range(X) by ~eps64 * lambda_max / gap (~1e2 * eps64 here; measured 1e-15)
    assert (P @ X).norm() / X.norm() < 1e4 * EPS64


def test_split_holds_the_smallest_preconditioned_components_and_reconstructs_w():
    g = torch.Generator().manual_seed(3)
    W = torch.randn(24, 32, generator=g, dtype=torch.float64)
    _, C = _low_rank_inputs()
    eig = symmetric_eigh(C)
    r = 5
    for balanced in (True, False):
        split = guarded_split(W, eig, r, damping=1e-6, balanced=balanced)
        C_d = C + split.damping * C.diagonal().mean() * torch.eye(32, dtype=torch.float64)
        U, S, Vh = torch.linalg.svd(W @ C_d, full_matrices=False)
        adapter = split.B0 @ split.A0
        # float64 SVDs of the same W C_d by two routes: equal to rounding at the scale of the largest singular value
        torch.testing.assert_close(adapter @ C_d, (U[:, -r:] * S[-r:]) @ Vh[-r:], rtol=0,
                                   atol=network_tol(torch.float64, S[0].item(), 1, 32))
        frozen = (U[:, :-r] * S[:-r]) @ torch.linalg.solve(C_d, Vh[:-r].T).T
        # the solve with C_d amplifies float64 rounding by its condition number (~5e6, from the 1e-6 damping)
        assert (frozen + adapter - W).norm() / W.norm() < 64 * EPS64 * torch.linalg.cond(C_d).item()
        assert split.reconstruction_error <= RECONSTRUCTION_TOL  # the split's own acceptance test
    balanced = guarded_split(W, eig, r, balanced=True)
    torch.testing.assert_close(balanced.B0.norm(dim=0), balanced.A0.norm(dim=1))


def test_init_equals_base_and_merge_is_exact():
    base = tiny_llama(vocab_size=2048)
    model = _guarded(base)
    ids = _ids(5, (2, 10))
    expected = base(input_ids=ids).logits
    assert_rounding_close(model(input_ids=ids).logits, expected, base)
    assert model.count_parameters().trainable == sum(4 * (m.in_features + m.out_features) for _, m in model.adapted_layers())
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    tuned = model(input_ids=ids).logits
    model.merge()
    assert_rounding_close(model(input_ids=ids).logits, tuned, base)
    model.unmerge()
    with model.adapters_disabled():
        assert torch.equal(model(input_ids=ids).logits, expected)


def _train(model, steps=5, lr=1e-2):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    ids = _ids(9, (4, 16))
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()


@pytest.mark.parametrize("init", ["guardspace", "lora"])
def test_protected_logits_unchanged_after_training(init):
    base = tiny_llama(vocab_size=2048)
    model = _guarded(base, init=init, null_threshold=0.0)
    _train(model)
    other = _ids(7, (1, 12))
    with torch.no_grad():
        for seq in _protected():
            assert_rounding_close(model(input_ids=seq).logits, base(input_ids=seq).logits, base)
        # not vacuous: inputs outside the protected set do change
        assert (model(input_ids=other).logits - base(input_ids=other).logits).abs().max() > 1e-3


def test_without_projector_protected_logits_drift():
    base = tiny_llama(vocab_size=2048)
    model = _guarded(base, projector=False)
    _train(model)
    seq = _protected()[0]
    with torch.no_grad():
        assert (model(input_ids=seq).logits - base(input_ids=seq).logits).abs().max() > 1e-3


def test_effective_update_lies_in_the_null_space():
    model = _guarded(tiny_llama(vocab_size=2048))
    _train(model, steps=2)
    for name, adapter in model.adapters_of("default").items():
        delta = adapter.delta_weight().double()
        Q = adapter.Q.double()
        outside = delta - (delta @ Q.T) @ Q  # the part of the row space outside range(P)
        assert delta.norm() > 0, name
        # Q is stored in float32: its rows are orthonormal and delta lies in their span only to fp32 rounding of
        # inner products of Q.size(0) terms; an update outside the null space leaves an O(|delta|) part
        assert outside.norm() <= network_tol(torch.float32, 1.0, 1, Q.size(0)) * delta.norm(), name


def test_saved_folder_loads_in_peft_and_round_trips(tmp_path):
    peft = pytest.importorskip("peft")
    base = tiny_llama(vocab_size=2048)
    model = _guarded(base)
    _train(model, steps=2)
    ids = _ids(11, (2, 10))
    expected = model(input_ids=ids).logits
    model.save(tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter")
    assert_rounding_close(theirs(input_ids=ids).logits, expected, base)
    ours = load_adapter(copy.deepcopy(base), tmp_path / "adapter")
    assert torch.equal(ours(input_ids=ids).logits, expected)


def test_bad_input_is_a_clear_error():
    base = tiny_llama(vocab_size=2048)
    config = GuardSpaceConfig(r=4, target_modules=["q_proj"])
    with pytest.raises(InvalidInputError, match="calibration statistics"):
        add_adapter(copy.deepcopy(base), config)
    names = find_targets(base, config)
    full = {n: SecondMoment(torch.eye(64, dtype=torch.float64) * 100, 100) for n in names}  # spans everything
    with pytest.raises(InvalidInputError, match="span all"):
        add_adapter(copy.deepcopy(base), config, statistics=full)
    wrong = {n: SecondMoment(torch.eye(8, dtype=torch.float64), 10) for n in names}
    with pytest.raises(InvalidInputError, match="inputs"):
        add_adapter(copy.deepcopy(base), config, statistics=wrong)
    for bad in (dict(init="pissa"), dict(null_threshold=-1.0), dict(damping=0.0)):
        with pytest.raises(InvalidInputError):
            GuardSpaceConfig(target_modules=["q_proj"], **bad).validate()


@pytest.mark.real_model
def test_real_smollm2_protected_logits_survive_training(smollm2):
    """The headline invariant on the embedded model: top-2 layers guarded, 3 AdamW steps on other text."""
    base, tok = smollm2
    model_copy = copy.deepcopy(base)
    protected = [tok(t, return_tensors="pt")["input_ids"] for t in ("The garden needs water every morning.", "Roses like sun.")]
    config = GuardSpaceConfig(r=4, target_modules=TARGETS, layers_to_transform=[28, 29], null_threshold=0.0)
    stats = collect_second_moments(model_copy, find_targets(model_copy, config), protected, use_cache=False)
    expected = [base(input_ids=p).logits for p in protected]
    model = add_adapter(model_copy, config, statistics=stats)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = tok("Trains run on rails between the cities of the north.", return_tensors="pt")["input_ids"]
    for _ in range(3):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    with torch.no_grad():
        for p, e in zip(protected, expected):
            assert_rounding_close(model(input_ids=p).logits, e, base)
        # not vacuous: the trained text moves well past the bound above (measured ~3 against a bound of ~0.03)
        reference = base(input_ids=ids).logits
        assert (model(input_ids=ids).logits - reference).abs().max() > 10 * logits_tol(base, reference)
