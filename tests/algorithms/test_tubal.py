"""Tubal algebra and low-tubal-rank recovery: the card's invariants, cross-checks and refusals."""

import numpy as np
import pytest
import torch

from rankwise.algorithms.tubal import (
    GaussianMeasurements, block_circulant, factorized_gd, fgd_gradient, fgd_objective, fold_slices,
    fourier_singular_values, gram_from_factor, low_tubal_rank_psd, small_init, spectral_init, t_frobenius_norm,
    t_identity, t_product, t_spectral_norm, t_svd, t_transpose, to_fourier, tubal_rank, unfold_slices,
)
from rankwise.errors import InvalidInputError, NumericalError

pytestmark = pytest.mark.method("tubal-rank-recovery")

EPS = torch.finfo(torch.float64).eps


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _tol(*tensors):
    # rounding of an FFT-based product: a few eps x (sum of sizes) x magnitudes
    size = sum(t.numel() for t in tensors)
    scale = max(float(t.abs().max()) for t in tensors) ** 2
    return 64 * EPS * size * scale


# ---- the t-product -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_t_product_equals_block_circulant_product(k):
    a, b = _rand(4, 5, k, seed=1), _rand(5, 3, k, seed=2)
    direct = fold_slices(block_circulant(a) @ unfold_slices(b), k)
    torch.testing.assert_close(t_product(a, b), direct, rtol=0, atol=_tol(a, b))


def test_block_circulant_layout_and_transpose():
    a = _rand(3, 2, 4, seed=3)
    c = block_circulant(a)
    assert c.shape == (12, 8)
    for i in range(4):
        for j in range(4):
            torch.testing.assert_close(c[3 * i:3 * i + 3, 2 * j:2 * j + 2], a[:, :, (i - j) % 4], rtol=0, atol=0)
    torch.testing.assert_close(block_circulant(t_transpose(a)), c.T, rtol=0, atol=0)


def test_associativity_transpose_of_product_and_identity():
    a, b, c = _rand(3, 4, 5, seed=4), _rand(4, 2, 5, seed=5), _rand(2, 6, 5, seed=6)
    tol = _tol(a, b, c) * 8
    torch.testing.assert_close(t_product(t_product(a, b), c), t_product(a, t_product(b, c)), rtol=0, atol=tol)
    torch.testing.assert_close(t_transpose(t_product(a, b)), t_product(t_transpose(b), t_transpose(a)), rtol=0, atol=tol)
    torch.testing.assert_close(t_product(a, t_identity(4, 5)), a, rtol=0, atol=tol)
    torch.testing.assert_close(t_product(t_identity(3, 5), a), a, rtol=0, atol=tol)
    torch.testing.assert_close(t_transpose(t_transpose(a)), a, rtol=0, atol=0)


def test_fourier_transform_agrees_with_tensorly_mode_product_and_is_real_on_return():
    tl = pytest.importorskip("tensorly")
    from tensorly.tenalg import mode_dot

    a = _rand(3, 4, 6, seed=7)
    k = a.shape[2]
    dft = np.exp(-2j * np.pi * np.outer(np.arange(k), np.arange(k)) / k)
    theirs = mode_dot(a.numpy().astype(np.complex128), dft, mode=2)
    np.testing.assert_allclose(to_fourier(a).numpy(), theirs, rtol=0, atol=64 * k * EPS * float(a.abs().max()))
    back = torch.fft.ifft(to_fourier(a), dim=-1)
    assert float(back.imag.abs().max()) < 1e-12 * float(a.abs().max())
    # tensorly's Frobenius norm and unfolding agree with ours
    assert t_frobenius_norm(a) == pytest.approx(float(tl.norm(a.numpy(), 2)), rel=1e-13)
    np.testing.assert_allclose(unfold_slices(a).numpy(), np.concatenate([a.numpy()[:, :, i] for i in range(k)], 0))


def test_parseval():
    a = _rand(5, 4, 3, seed=8)
    a_hat = to_fourier(a)
    assert float(a.pow(2).sum()) == pytest.approx(float(a_hat.abs().pow(2).sum()) / a.shape[2], rel=1e-13)


def test_spectral_norm_is_the_block_circulant_norm():
    a = _rand(4, 3, 5, seed=9)
    assert t_spectral_norm(a) == pytest.approx(float(torch.linalg.matrix_norm(block_circulant(a), ord=2)), rel=1e-12)


# ---- t-SVD and tubal rank --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 4, 3), (3, 6, 4), (4, 4, 1), (6, 2, 2)])
def test_t_svd_reconstructs_with_orthonormal_factors(shape):
    a = _rand(*shape, seed=10)
    u, s, v = t_svd(a)
    p = min(shape[:2])
    assert u.shape == (shape[0], p, shape[2]) and s.shape == (p, p, shape[2]) and v.shape == (shape[1], p, shape[2])
    tol = _tol(a) * 16
    torch.testing.assert_close(t_product(t_product(u, s), t_transpose(v)), a, rtol=0, atol=max(tol, 1e-10))
    torch.testing.assert_close(t_product(t_transpose(u), u), t_identity(p, shape[2]), rtol=0, atol=1e-12)
    torch.testing.assert_close(t_product(t_transpose(v), v), t_identity(p, shape[2]), rtol=0, atol=1e-12)
    s_hat = to_fourier(s)
    off = s_hat - torch.diag_embed(torch.diagonal(s_hat, dim1=0, dim2=1), dim1=0, dim2=1)
    assert float(off.abs().max()) < 1e-12  # f-diagonal


def test_t_svd_matches_block_circulant_singular_values():
    a = _rand(4, 3, 5, seed=11)
    ours = torch.sort(fourier_singular_values(a).flatten(), descending=True).values
    theirs = torch.linalg.svdvals(block_circulant(a))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("r", [1, 2, 4])
def test_tubal_rank_of_a_gram_is_r_and_its_slices_are_hermitian_psd(r):
    x = _rand(7, r, 3, seed=12)
    z = t_product(x, t_transpose(x))
    assert tubal_rank(z) == r
    torch.testing.assert_close(z, t_transpose(z), rtol=0, atol=_tol(x) * 4)
    z_hat = to_fourier(z)
    for i in range(3):
        m = z_hat[:, :, i]
        torch.testing.assert_close(m, m.mH, rtol=0, atol=_tol(x) * 4)
        assert float(torch.linalg.eigvalsh((m + m.mH) / 2).min()) >= -_tol(x) * 4
    assert tubal_rank(_rand(5, 4, 3, seed=13)) == 4


def test_low_tubal_rank_instance_is_normalised():
    x = low_tubal_rank_psd(10, 2, 3, seed=0)
    assert t_spectral_norm(x) == pytest.approx(1.0, rel=1e-12)
    assert tubal_rank(x) == 2
    torch.testing.assert_close(x, t_transpose(x), rtol=0, atol=0)


# ---- measurements, gradient, initialisations -----------------------------------------------------------------


def test_measurement_adjoint_and_isometry():
    ops = GaussianMeasurements.draw(4000, (3, 3, 2), seed=0)
    z, w = _rand(3, 3, 2, seed=1), _rand(4000, seed=2)
    assert float((ops(z) * w).sum()) == pytest.approx(float((z * ops.adjoint(w)).sum()), rel=1e-11)
    diag = ops.matrix.pow(2).mean(0)  # diagonal of (1/m) M*M
    # each entry is a mean of m chi-square(1) draws: sd sqrt(2/m); the mean of 18 of them has sd sqrt(2/(18 m))
    assert float(diag.mean()) == pytest.approx(1.0, abs=5 * (2 / (18 * 4000)) ** 0.5)
    train, val = ops.split(400)
    assert train.m == 3600 and val.m == 400
    torch.testing.assert_close(torch.cat([train(z), val(z)]), ops(z), rtol=0, atol=0)


def test_analytic_gradient_matches_autograd():
    x = low_tubal_rank_psd(5, 2, 3, seed=1)
    ops = GaussianMeasurements.draw(120, (5, 5, 3), seed=2)
    y = ops(x) + 0.01 * _rand(120, seed=3)
    u = _rand(5, 4, 3, seed=4).requires_grad_(True)
    fgd_objective(ops, y, u).backward()
    torch.testing.assert_close(fgd_gradient(ops, y, u.detach()), u.grad, rtol=1e-10, atol=1e-12)


def test_gradient_needs_the_symmetrisation():
    x = low_tubal_rank_psd(4, 1, 2, seed=5)
    ops = GaussianMeasurements.draw(60, (4, 4, 2), seed=6)
    u = _rand(4, 2, 2, seed=7)
    y = ops(x)
    residual = ops(gram_from_factor(u)) - y
    g = ops.adjoint(residual) / ops.m
    unsym = t_product(g, u)
    assert float((unsym - fgd_gradient(ops, y, u)).abs().max()) > 1e-3  # the A_i are not symmetric


def test_k_equal_one_is_matrix_fgd():
    n, R, m = 6, 3, 80
    x = low_tubal_rank_psd(n, 2, 1, seed=8)
    ops = GaussianMeasurements.draw(m, (n, n, 1), seed=9)
    y = ops(x)
    u0 = _rand(n, R, 1, seed=10) * 0.1
    res = factorized_gd(ops, y, u0, step=0.05, iterations=3)
    a = ops.matrix.reshape(m, n, n)
    u = u0[:, :, 0].clone()
    for _ in range(3):
        r = torch.einsum("mij,ij->m", a, u @ u.T) - y
        g = torch.einsum("m,mij->ij", r, a) / m
        u = u - 0.05 * ((g + g.T) / 2) @ u
    torch.testing.assert_close(res.final_factor[:, :, 0], u, rtol=1e-10, atol=1e-13)


def test_spectral_init_is_the_best_psd_rank_r_part_of_every_slice():
    x = low_tubal_rank_psd(6, 2, 3, seed=11)
    ops = GaussianMeasurements.draw(300, (6, 6, 3), seed=12)
    y = ops(x)
    u0 = spectral_init(ops, y, 2)
    y_sym = ops.adjoint(y) / ops.m
    y_sym = (y_sym + t_transpose(y_sym)) / 2
    z_hat, y_hat = to_fourier(gram_from_factor(u0)), to_fourier(y_sym)
    for i in range(3):
        vals, vecs = torch.linalg.eigh((y_hat[:, :, i] + y_hat[:, :, i].mH) / 2)
        top = (vecs[:, -2:] * vals[-2:].clamp_min(0).to(vecs.dtype)) @ vecs[:, -2:].mH
        torch.testing.assert_close(z_hat[:, :, i], top, rtol=0, atol=1e-10)
    assert u0.dtype == torch.float64 and not u0.is_complex()


def test_small_init_scale_and_determinism():
    u = small_init(30, 10, 3, 1e-3, seed=0)
    assert u.shape == (30, 10, 3)
    # entries N(0, alpha^2 / R): the sample variance of 900 entries is within 20% w.p. ~1 - 1e-6
    assert float(u.pow(2).mean()) == pytest.approx(1e-6 / 10, rel=0.2)
    torch.testing.assert_close(u, small_init(30, 10, 3, 1e-3, seed=0), rtol=0, atol=0)


# ---- recovery and early stopping -----------------------------------------------------------------------------


def test_noiseless_exact_rank_recovery_and_early_stopping_picks_min_validation_loss():
    x = low_tubal_rank_psd(6, 1, 2, seed=13)
    ops = GaussianMeasurements.draw(150, (6, 6, 2), seed=14)
    train, val = ops.split(15)
    y = ops(x)
    res = factorized_gd(train, y[:-15], small_init(6, 1, 2, 1e-3, seed=1), step=0.3, iterations=400,
                        validation=(val, y[-15:]), truth=x)
    assert float(res.final_rse) < 1e-6
    assert int(res.es_step) == int(res.val_loss.argmin())
    torch.testing.assert_close(res.estimate, gram_from_factor(res.factor), rtol=0, atol=0)
    assert not bool(res.diverged)


def test_batched_runs_equal_separate_runs_and_zero_padding_is_inert():
    x = low_tubal_rank_psd(5, 1, 2, seed=15)
    ops = GaussianMeasurements.draw(100, (5, 5, 2), seed=16)
    y = ops(x) + 0.01 * _rand(100, seed=17)
    u1, u2 = small_init(5, 2, 2, 1e-2, seed=1), small_init(5, 3, 2, 1e-2, seed=2)
    batch = torch.zeros(2, 5, 3, 2, dtype=torch.float64)
    batch[0, :, :2], batch[1] = u1, u2
    both = factorized_gd(ops, y, batch, step=torch.tensor([0.1, 0.2]), iterations=50)
    one = factorized_gd(ops, y, u1, step=0.1, iterations=50)
    two = factorized_gd(ops, y, u2, step=0.2, iterations=50)
    # batched and single products round differently, and GD from a small start amplifies rounding (growth of
    # ~(1 + eta sigma)^t over 50 steps): agree to 1e-6 relative, far below the factors' change over the run
    torch.testing.assert_close(both.final_factor[0, :, :2], one.final_factor, rtol=1e-6, atol=1e-9)
    assert float(both.final_factor[0, :, 2:].abs().max()) == 0.0
    torch.testing.assert_close(both.final_factor[1], two.final_factor, rtol=1e-6, atol=1e-9)
    assert float((one.final_factor - u1).abs().max()) > 1e-3


def test_divergence_is_flagged_not_chosen():
    x = low_tubal_rank_psd(4, 1, 2, seed=18)
    ops = GaussianMeasurements.draw(60, (4, 4, 2), seed=19)
    train, val = ops.split(6)
    y = ops(x)
    res = factorized_gd(train, y[:-6], small_init(4, 2, 2, 10.0, seed=0), step=50.0, iterations=40,
                        validation=(val, y[-6:]), truth=x)
    assert bool(res.diverged)
    assert bool(torch.isfinite(res.factor).all())  # the early-stopping iterate is a finite one


# ---- refusals --------------------------------------------------------------------------------------------------


def test_bad_tensors_are_refused():
    a = _rand(3, 4, 2)
    with pytest.raises(InvalidInputError, match="third-order"):
        t_product(_rand(3, 4), a)
    with pytest.raises(InvalidInputError, match="t-product needs"):
        t_product(a, _rand(3, 2, 2))
    with pytest.raises(InvalidInputError, match="t-product needs"):
        t_product(a, _rand(4, 2, 3))
    bad = a.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(NumericalError):
        t_svd(bad)
    with pytest.raises(NumericalError):
        t_transpose(torch.full((2, 2, 2), float("inf"), dtype=torch.float64))
    with pytest.raises(InvalidInputError, match="real floating"):
        tubal_rank(torch.ones(2, 2, 2, dtype=torch.int64))
    with pytest.raises(InvalidInputError):
        t_svd(_rand(2, 3, 4, 5))
    with pytest.raises(InvalidInputError, match="empty"):
        t_product(torch.zeros(0, 2, 2, dtype=torch.float64), _rand(2, 2, 2))


def test_bad_recovery_inputs_are_refused():
    ops = GaussianMeasurements.draw(40, (4, 4, 2), seed=0)
    y = torch.zeros(40, dtype=torch.float64)
    with pytest.raises(InvalidInputError, match="init must be"):
        factorized_gd(ops, y, _rand(5, 2, 2))
    with pytest.raises(InvalidInputError, match="y must be"):
        factorized_gd(ops, y[:10], _rand(4, 2, 2))
    y_bad = y.clone()
    y_bad[3] = float("nan")
    with pytest.raises(InvalidInputError, match="y must be"):
        factorized_gd(ops, y_bad, _rand(4, 2, 2))
    with pytest.raises(InvalidInputError, match="step"):
        factorized_gd(ops, y, _rand(4, 2, 2), step=-1.0)
    with pytest.raises(InvalidInputError, match="truth"):
        factorized_gd(ops, y, _rand(4, 2, 2), truth=_rand(4, 4, 3))
    with pytest.raises(InvalidInputError, match="tubal rank R"):
        spectral_init(ops, y, 5)
    with pytest.raises(InvalidInputError, match="tubal rank R"):
        small_init(4, 0, 2)
    with pytest.raises(InvalidInputError, match="matrix must be"):
        GaussianMeasurements(torch.zeros(3, 10, dtype=torch.float64), (2, 2, 2))
    with pytest.raises(InvalidInputError, match="Z must have shape"):
        ops(_rand(3, 3, 2))
    with pytest.raises(InvalidInputError, match="validation"):
        ops.split(40)
    with pytest.raises(NumericalError):
        factorized_gd(ops, y, torch.full((4, 2, 2), float("nan"), dtype=torch.float64))
