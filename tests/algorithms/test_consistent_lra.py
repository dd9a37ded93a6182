"""Consistent low-rank approximation: the card's invariants, the streaming API and its refusals."""

import math

import numpy as np
import pytest
import torch

from rankwise.algorithms.consistent_lra import (
    FrequentDirectionsLRA, LazyAdditiveLRA, RecomputeSVD, RidgeLeverageLRA, VerifiedMultiplicativeLRA,
    adversarial_alternation, growth_exponent, lower_bound_phases, prefix_optimal_cost, projector_distance,
)
from rankwise.algorithms.consistent_lra.linalg import EPS64
from rankwise.errors import InvalidInputError, NumericalError

pytestmark = pytest.mark.method("consistent-lra")

D, K = 12, 3


def _all(dim=D, rank=K, eps=0.2, seed=0):
    return [LazyAdditiveLRA(dim, rank, eps), RidgeLeverageLRA(dim, rank, eps, seed=seed),
            VerifiedMultiplicativeLRA(dim, rank, eps), RecomputeSVD(dim, rank), FrequentDirectionsLRA(dim, rank, eps)]


def _integer_rows(n=150, d=D, seed=0):
    # integer entries: every Gram sum is exact in float64, so block splits give bit-identical states
    rng = np.random.default_rng(seed)
    scale = np.array([6, 5, 4] + [1] * (d - 3))
    return np.round(rng.standard_normal((n, d)) * scale)


@pytest.fixture(scope="module")
def stream_rows():
    return adversarial_alternation(300, D, K, seed=1)


@pytest.fixture(scope="module")
def opt(stream_rows):
    return prefix_optimal_cost(torch.from_numpy(stream_rows), K)


# ---- subspaces and recourse ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", _all(), ids=lambda s: type(s).__name__)
def test_every_output_is_a_rank_k_projector_and_steps_are_bounded(stream, stream_rows):
    for block in (stream_rows[:1], stream_rows[1:40], stream_rows[40:]):
        stream.update(block)
        p = stream.projector
        tol = 64 * D * EPS64
        assert torch.allclose(p, p.T, atol=tol)
        assert torch.allclose(p @ p, p, atol=tol)
        assert float(torch.trace(p)) == pytest.approx(K, abs=tol)
    step = stream.trace.step_recourse
    assert bool((step >= 0).all()) and bool((step <= 2 * K).all())
    assert stream.recourse == pytest.approx(float(step.sum()))


def test_projector_distance_is_basis_invariant_and_matches_definition():
    gen = torch.Generator().manual_seed(0)
    v1 = torch.linalg.qr(torch.randn(D, K, generator=gen, dtype=torch.float64))[0].T
    v2 = torch.linalg.qr(torch.randn(D, K, generator=gen, dtype=torch.float64))[0].T
    q = torch.linalg.qr(torch.randn(K, K, generator=gen, dtype=torch.float64))[0]
    direct = float((v1.T @ v1 - v2.T @ v2).pow(2).sum())
    assert float(projector_distance(v1, v2)) == pytest.approx(direct, rel=1e-12)
    assert float(projector_distance(q @ v1, v2)) == pytest.approx(direct, rel=1e-12)
    assert float(projector_distance(v1, v1)) == pytest.approx(0.0, abs=1e-13)
    swapped = torch.eye(2 * K, D, dtype=torch.float64)
    assert float(projector_distance(swapped[:K], swapped[K:])) == pytest.approx(2 * K)


def test_opt_and_norm_are_non_decreasing_and_zero_for_t_le_k(stream_rows, opt):
    f = torch.cumsum(torch.from_numpy(stream_rows).pow(2).sum(1), 0)
    slack = 64 * D * EPS64 * f
    assert bool((opt[1:] >= opt[:-1] - slack[1:]).all())
    assert bool((f[1:] >= f[:-1]).all())
    assert bool((opt[:K] <= slack[:K]).all())
    assert float(opt[K]) > 0  # noise makes row k+1 leave any k-dimensional span


@pytest.mark.parametrize("stream", _all(), ids=lambda s: type(s).__name__)
def test_cost_is_never_below_opt(stream, stream_rows, opt):
    stream.update(stream_rows)
    tr = stream.trace
    assert bool((tr.cost >= opt - 1e-9 * tr.frob2).all())


# ---- the promises ----------------------------------------------------------------------------------------------


def test_additive_bound_every_step_and_recomputations_within_log_bound(stream_rows, opt):
    s = LazyAdditiveLRA(D, K, 0.1)
    s.update(stream_rows)
    tr = s.trace
    assert bool(tr.holds(opt).all())
    assert float(tr.additive_error(opt).max()) <= 0.1
    first = float(tr.frob2[tr.recomputed.nonzero()[0, 0]])
    bound = 1 + math.log(float(tr.frob2[-1]) / first) / math.log(1.1)
    assert 2 <= s.recomputations <= bound
    assert s.recourse <= 2 * K * bound
    # the rule itself: a recomputation exactly when the norm has grown by more than (1 + eps)
    idx = tr.recomputed.nonzero()[:, 0]
    assert bool((tr.frob2[idx[1:]] > 1.1 * tr.frob2[idx[:-1]]).all())


def test_violation_of_another_promise_is_judged_at_the_same_eps(stream_rows, opt):
    # the lazy additive stream keeps cost <= OPT + eps F; asked about (1 + eps) OPT it must be judged against that
    # bound, not its own: on the adversarial alternation it breaks the multiplicative one
    s = LazyAdditiveLRA(D, K, 0.2)
    s.update(stream_rows)
    tr = s.trace
    own, multiplicative = tr.violation(opt), tr.violation(opt, "multiplicative")
    expected = (tr.cost - 1.2 * opt) / tr.frob2
    slack = tr.bound(opt, "multiplicative") - 1.2 * opt  # the rounding slack, a few ulps of F
    assert bool((slack >= 0).all()) and float((slack / tr.frob2).max()) < 1e-9
    assert torch.allclose(multiplicative, expected - slack / tr.frob2, rtol=0, atol=1e-12)
    assert float(own.max()) <= 0 < float(multiplicative.max())
    assert torch.equal(tr.violation(opt, "additive"), own)
    with pytest.raises(InvalidInputError):
        tr.violation(opt, "sometimes")


def test_additive_stream_does_not_move_between_recomputations(stream_rows):
    s = LazyAdditiveLRA(D, K, 0.2)
    s.update(stream_rows)
    tr = s.trace
    assert bool((tr.step_recourse[~tr.recomputed] == 0).all())


@pytest.mark.parametrize("cls", [VerifiedMultiplicativeLRA, RecomputeSVD, FrequentDirectionsLRA])
def test_certified_multiplicative_promises_hold_every_step(cls, stream_rows, opt):
    s = cls(D, K) if cls is RecomputeSVD else cls(D, K, 0.2)
    s.update(stream_rows)
    assert bool(s.trace.holds(opt).all())
    assert s.guarantee().holds and s.guarantee().certified


def test_frequent_directions_really_shrinks_and_keeps_its_bound():
    rows = adversarial_alternation(400, 40, 5, seed=3)
    s = FrequentDirectionsLRA(40, 5, 0.5)  # l = 15 < d: a real sketch
    s.update(rows)
    assert s.shrinks > 0 and s.sketch_rows == 15
    assert s.trace.eps == pytest.approx(0.5)
    opt = prefix_optimal_cost(torch.from_numpy(rows), 5)
    assert bool(s.trace.holds(opt).all())


def test_verified_stream_holds_every_row_while_opt_is_zero(stream_rows):
    s = VerifiedMultiplicativeLRA(D, K, 0.2)
    for t in range(K):
        s.update(stream_rows[t])
        resid = torch.from_numpy(stream_rows[: t + 1]) @ (torch.eye(D, dtype=torch.float64) - s.projector)
        assert float(resid.pow(2).sum()) <= 1e-12 * s.frobenius2


def test_lazy_paths_are_not_longer_than_recomputing(stream_rows):
    svd = RecomputeSVD(D, K)
    svd.update(stream_rows)
    for s in (LazyAdditiveLRA(D, K, 0.1), VerifiedMultiplicativeLRA(D, K, 0.1)):
        s.update(stream_rows)
        assert float(s.trace.path_length[-1]) <= float(svd.trace.path_length[-1]) * (1 + 1e-9)


def test_guarantee_matches_trace_at_the_last_step(stream_rows, opt):
    for s in _all():
        s.update(stream_rows)
        g = s.guarantee()
        assert g.step == len(stream_rows)
        assert g.cost == pytest.approx(float(s.trace.cost[-1]), rel=1e-9, abs=1e-9 * g.frob2)
        assert g.opt == pytest.approx(float(opt[-1]), rel=1e-9)


def test_track_opt_records_opt(stream_rows, opt):
    s = LazyAdditiveLRA(D, K, 0.2, track_opt=True)
    s.update(stream_rows[:100])
    s.update(stream_rows[100:])
    torch.testing.assert_close(s.trace.opt, opt, rtol=1e-9, atol=1e-9 * float(s.frobenius2))


# ---- recourse behaviour on the card's instances ----------------------------------------------------------------


def test_adversarial_alternation_makes_recomputing_swap_and_lazy_algorithms_not():
    rows = adversarial_alternation(1200, 20, 4, seed=0)
    svd, lazy = RecomputeSVD(20, 4), VerifiedMultiplicativeLRA(20, 4, 0.2)
    svd.update(rows)
    lazy.update(rows)
    # every burst (every other row) swaps the 4th direction: ~2 per swap
    assert svd.recourse > 0.8 * 2 * (1200 / 2)
    assert lazy.recourse < 0.05 * svd.recourse
    assert growth_exponent(svd.trace.recourse) > 0.8
    assert growth_exponent(lazy.trace.recourse) < 0.35


def test_lower_bound_phases_force_every_multiplicative_algorithm_to_move():
    rows, phase = lower_bound_phases(600, 20, 5, 0.1, seed=0)
    assert phase.max() >= 5
    for s in (VerifiedMultiplicativeLRA(20, 5, 0.1), RecomputeSVD(20, 5)):
        s.update(rows)
        step = s.trace.step_recourse.numpy()
        for p in range(1, int(phase.max())):  # the last phase may be cut off by n
            assert step[phase == p].sum() > 0, f"{type(s).__name__} did not move in phase {p}"


def test_growth_exponent_reads_linear_and_logarithmic_curves():
    t = np.arange(1, 10001, dtype=float)
    assert growth_exponent(3 * t) == pytest.approx(1.0, abs=1e-9)
    assert growth_exponent(np.log(t + 1)) < 0.15
    assert growth_exponent(np.zeros(100)) == 0.0


# ---- the streaming API -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: LazyAdditiveLRA(D, K, 0.1), lambda: RidgeLeverageLRA(D, K, 0.2, seed=4),
                                  lambda: VerifiedMultiplicativeLRA(D, K, 0.1), lambda: RecomputeSVD(D, K),
                                  lambda: FrequentDirectionsLRA(D, K, 0.5)], ids=["A", "B", "D", "svd", "fd"])
def test_blocks_and_single_rows_give_the_same_stream(make):
    rows = _integer_rows()
    one, many = make(), make()
    one.update(rows)
    cuts = [0, 1, 7, 8, 60, 149, 150]
    for a, b in zip(cuts[:-1], cuts[1:]):
        many.update(torch.from_numpy(rows[a:b]) if a % 2 else rows[a:b])
    for a, b in ((one.trace.step_recourse, many.trace.step_recourse), (one.trace.cost, many.trace.cost)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * one.frobenius2)
    assert bool((one.trace.recomputed == many.trace.recomputed).all())
    torch.testing.assert_close(one.basis, many.basis, rtol=0, atol=1e-9)


def test_numpy_torch_and_single_row_inputs():
    rows = _integer_rows(20)
    a, b = LazyAdditiveLRA(D, K), LazyAdditiveLRA(D, K)
    a.update(rows)
    for r in rows:
        b.update(list(r))  # a plain list of numbers, one row [d]
    assert a.steps == b.steps == 20
    torch.testing.assert_close(a.gram, b.gram, rtol=0, atol=0)
    c = LazyAdditiveLRA(D, K)
    c.update(torch.from_numpy(rows).float())  # fp32 in: converted to float64
    assert c.gram.dtype == torch.float64


def test_sampling_is_seeded_and_different_seeds_differ(stream_rows):
    a, b, c = (RidgeLeverageLRA(D, K, 0.5, oversampling=0.05, seed=sd) for sd in (1, 1, 2))
    for s in (a, b, c):
        s.update(stream_rows)
    assert a.samples == b.samples and a.recourse == b.recourse
    assert a.samples != c.samples or a.recourse != c.recourse
    assert a.samples < len(stream_rows)  # a small oversampling keeps only part of the rows
    assert a.recomputations == a.samples


# ---- refusals --------------------------------------------------------------------------------------------------


def test_rank_larger_than_dimension_and_bad_parameters_are_refused():
    with pytest.raises(InvalidInputError, match="larger than the dimension"):
        LazyAdditiveLRA(4, 5)
    for bad in (dict(dim=0, rank=1), dict(dim=4, rank=0), dict(dim=4.5, rank=2)):
        with pytest.raises(InvalidInputError):
            LazyAdditiveLRA(**bad)
    for eps in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(InvalidInputError, match="eps"):
            VerifiedMultiplicativeLRA(4, 2, eps)
    with pytest.raises(InvalidInputError, match="sketch_rows"):
        FrequentDirectionsLRA(8, 3, sketch_rows=3)
    with pytest.raises(InvalidInputError, match="oversampling"):
        RidgeLeverageLRA(8, 3, oversampling=0)


@pytest.mark.parametrize("stream", _all(), ids=lambda s: type(s).__name__)
def test_refused_rows_leave_the_stream_unchanged(stream, stream_rows):
    stream.update(stream_rows[:30])
    before = (stream.basis, stream.gram, stream.recourse, stream.changes, stream.steps, stream.recomputations,
              len(stream.trace))
    bad_blocks = [
        (np.zeros((0, D)), InvalidInputError, "empty"),
        (np.ones((3, D + 1)), InvalidInputError, "width"),
        (np.ones(D - 1), InvalidInputError, "width"),
        (np.ones((2, 2, D)), InvalidInputError, "shape"),
        (np.array([["a"] * D]), InvalidInputError, "real numbers"),
        (np.where(np.arange(D) == 3, np.nan, 1.0)[None].repeat(4, 0), NumericalError, "NaN"),
        (torch.full((2, D), float("inf")), NumericalError, "row 0"),
    ]
    for block, err, msg in bad_blocks:
        with pytest.raises(err, match=msg):
            stream.update(block)
    after = (stream.basis, stream.gram, stream.recourse, stream.changes, stream.steps, stream.recomputations,
             len(stream.trace))
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]) and before[2:] == after[2:]
    stream.update(stream_rows[30:])  # and it carries on
    assert stream.steps == len(stream_rows)


def test_an_error_inside_processing_rolls_back(monkeypatch, stream_rows):
    s = VerifiedMultiplicativeLRA(D, K, 0.2)
    s.update(stream_rows[:20])
    basis, recourse = s.basis, s.recourse
    import rankwise.algorithms.consistent_lra.verified as verified

    calls = []

    def boom(gram, rows):
        calls.append(1)
        if len(calls) > 1:  # fail in the second chunk, after the first chunk's state changes
            raise RuntimeError("eigh failed")
        return real(gram, rows)

    real = verified.prefix_grams
    monkeypatch.setattr(verified, "prefix_grams", boom)
    monkeypatch.setattr(verified, "chunk_length", lambda d: 16)
    with pytest.raises(RuntimeError):
        s.update(stream_rows[20:])
    assert s.steps == 20 and s.recourse == recourse and torch.equal(s.basis, basis) and len(s.trace) == 20


def test_trace_without_opt_asks_for_it(stream_rows):
    s = LazyAdditiveLRA(D, K)
    s.update(stream_rows[:10])
    with pytest.raises(InvalidInputError, match="track_opt"):
        s.trace.holds()
