"""CARE's linear algebra (core/linalg.py) and rank allocation (compress/mla/allocation.py): the card's invariants."""

import math

import pytest
import torch

from rankwise.compress.mla.allocation import allocate_ranks, greedy_rank_allocation, propagation_horizon, residual_fraction, tail_energies
from rankwise.core.linalg import (
    cholesky_whitener,
    clamped_eigh,
    diagonal_whitener,
    identity_whitener,
    relative_activation_error,
    sqrt_whitener,
    symmetric_inverse_sqrt,
    symmetric_sqrt,
    weighted_error,
    whitened_low_rank,
)
from rankwise.errors import InvalidInputError, NumericalError

pytestmark = pytest.mark.method("care-mla")


def correlated_batches(seed: int = 0, batches: int = 6, rows: int = 50, d: int = 24) -> list[torch.Tensor]:
    """Batches of rows with a strongly anisotropic, correlated distribution (like RMS-normed hidden states)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=torch.float64) * torch.logspace(0, -2, d, dtype=torch.float64)
    return [torch.randn(rows, d, generator=g, dtype=torch.float64) @ mix + 0.3 for _ in range(batches)]


def second_moment(batches: list[torch.Tensor]) -> torch.Tensor:
    x = torch.cat(batches)
    return x.T @ x / x.size(0)


def test_trace_identity_in_float64():
    batches = correlated_batches()
    c = second_moment(batches)
    delta = torch.randn(c.size(0), 10, dtype=torch.float64)
    rows = sum(b.size(0) for b in batches)
    direct = sum(float((b @ delta).pow(2).sum()) for b in batches) / rows
    for whitener in (sqrt_whitener(c, floor=0.0), cholesky_whitener(c)):
        via_whitener = float(whitener.apply(delta).pow(2).sum())
        assert abs(via_whitener - direct) / direct < 1e-8
    assert abs(weighted_error(delta.T, c) - direct) / direct < 1e-10  # weights are [out, in]: Delta^T here


def test_whiteners_square_to_c_and_solve_inverts_apply():
    c = second_moment(correlated_batches(1))
    y = torch.randn(c.size(0), 5, dtype=torch.float64)
    for whitener in (sqrt_whitener(c, floor=0.0), cholesky_whitener(c)):
        s = whitener.apply(torch.eye(c.size(0), dtype=torch.float64))
        assert torch.allclose(s.T @ s, c, rtol=1e-9, atol=1e-12)
        assert torch.allclose(whitener.apply(whitener.solve(y)), y, rtol=1e-8, atol=1e-10)
    diag = diagonal_whitener(torch.tensor([1.0, 2.0, 4.0]))
    assert torch.allclose(diag.solve(diag.apply(torch.ones(3, 2))), torch.ones(3, 2, dtype=torch.float64))
    sqrt = symmetric_sqrt(c, floor=0.0)
    # C^-1/2 C^1/2 = I up to float64 rounding amplified by the conditioning of C^1/2, sqrt(cond(C)) (~1.4e3 here)
    values = torch.linalg.eigvalsh(c)
    tol = 64 * c.size(0) * torch.finfo(torch.float64).eps * math.sqrt(float(values.max() / values.min()))
    assert torch.allclose(symmetric_inverse_sqrt(c, floor=0.0) @ sqrt, torch.eye(c.size(0), dtype=torch.float64), rtol=0, atol=tol)


def test_care_activation_error_at_most_plain_svd_for_every_rank():
    batches = correlated_batches(2)
    c = second_moment(batches)
    w = torch.randn(c.size(0), 12, dtype=torch.float64).T  # [out, in], as torch stores weights
    for r in range(1, 13):
        care = whitened_low_rank(w, sqrt_whitener(c, floor=0.0), r)
        plain = whitened_low_rank(w, identity_whitener(), r)
        assert relative_activation_error(w, care.product(), c) <= relative_activation_error(w, plain.product(), c) + 1e-12
        # The activation error equals the whitened tail energy (App. C) and the factors multiply to W_hat.
        tail = float(care.singular_values[r:].pow(2).sum())
        assert math.isclose(weighted_error(w - care.product(), c), tail, rel_tol=1e-8, abs_tol=1e-12)
        assert care.down.shape == (r, c.size(0)) and care.up.shape == (12, r)  # torch layout: W_hat = up @ down


def test_full_rank_reconstructs_the_weight():
    c = second_moment(correlated_batches(3))
    w = torch.randn(c.size(0), 8, dtype=torch.float64).T
    for whitener in (identity_whitener(), sqrt_whitener(c), cholesky_whitener(c)):
        assert torch.allclose(whitened_low_rank(w, whitener, 8).product(), w, atol=1e-9)


def test_singular_covariance_is_clamped_not_nan():
    x = torch.randn(5, 16, dtype=torch.float64)  # fewer rows than dimensions: C has rank 5
    c = x.T @ x / 5
    values, _ = clamped_eigh(c)
    assert (values > 0).all()
    factors = whitened_low_rank(torch.randn(16, 4, dtype=torch.float64).T, sqrt_whitener(c), 3)
    assert torch.isfinite(factors.product()).all()
    with pytest.raises(NumericalError):
        cholesky_whitener(c - 1e-3 * torch.eye(16, dtype=torch.float64))
    with pytest.raises(NumericalError):
        sqrt_whitener(torch.full((3, 3), float("nan")))


def power_law(n: int = 40, p: float = 1.5) -> torch.Tensor:
    return torch.arange(1, n + 1, dtype=torch.float64) ** (-p / 2)


def test_water_filling_sums_to_budget_and_respects_bounds():
    g = torch.Generator().manual_seed(0)
    spectra = [power_law(40, p).mul(s) for p, s in zip(torch.rand(9, generator=g) * 3 + 0.2, torch.rand(9, generator=g) + 0.5)]
    for score in ("paper", "code"):
        ranks = allocate_ranks(spectra, 10, "adjusted", score, min_rank=4, max_rank=17)
        assert sum(ranks) == 9 * 10
        assert all(4 <= r <= 17 for r in ranks)
    assert allocate_ranks(spectra, 10) == [10] * 9
    # The default bounds are the authors': [r / 2, 2 r], capped at each matrix's width.
    ranks = allocate_ranks([power_law(12), power_law(40, 0.1)], 8, "adjusted")
    assert sum(ranks) == 16 and all(4 <= r <= 16 for r in ranks) and ranks[0] <= 12


def test_identical_spectra_give_uniform_ranks_and_ties_go_to_the_lowest_layer():
    spectra = [power_law()] * 6  # a decaying spectrum: the paper's score falls with rank
    assert allocate_ranks(spectra, 8, "adjusted", "paper") == [8] * 6
    # One rank more than a multiple of the layer count: the extra one goes to layer 0.
    ranks = greedy_rank_allocation(3, 7, lambda i, r: 1.0 / (r + 1), 0, 10)
    assert ranks == [3, 2, 2]
    # The code score's horizon favours early layers, so identical spectra are front-loaded, never back-loaded.
    code = allocate_ranks(spectra, 8, "adjusted", "code")
    assert sum(code) == 48 and code == sorted(code, reverse=True) and code[0] > code[-1]


def test_paper_score_is_the_fraction_of_remaining_residual():
    sigma = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)
    tail = tail_energies(sigma)
    assert tail.tolist() == [14.0, 5.0, 1.0, 0.0]
    assert residual_fraction(sigma, tail, 0) == 9 / 14 and residual_fraction(sigma, tail, 1) == 4 / 5
    assert residual_fraction(sigma, tail, 3) == 0.0
    assert propagation_horizon(0, 3) == math.sqrt(3 / 2) and propagation_horizon(2, 3) == math.sqrt(1 / 2)


def test_allocation_rejects_impossible_requests():
    spectra = [power_law(10)] * 3
    with pytest.raises(InvalidInputError):
        allocate_ranks(spectra, 11)
    with pytest.raises(InvalidInputError):
        allocate_ranks(spectra, 0)
    with pytest.raises(InvalidInputError):
        allocate_ranks(spectra, 4, "adjusted", min_rank=5)
    with pytest.raises(InvalidInputError):
        greedy_rank_allocation(2, 30, lambda i, r: 1.0, 0, 10)
    with pytest.raises(KeyError):
        allocate_ranks(spectra, 4, "greedy")
