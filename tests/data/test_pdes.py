"""The PDE data (rankwise.data.pdes): the solvers against exact solutions, the resolutions against each other, and
the generators' determinism, cache and refusals. Tolerances follow from float32/float64 rounding, stated per test."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rankwise.core.cache import cache_root
from rankwise.core.threads import limit_threads
from rankwise.data import pdes
from rankwise.errors import InvalidInputError

EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps


@pytest.fixture(autouse=True)
def _one_thread():
    with limit_threads(1):
        yield


def truncation_norm(N: int, n: int) -> float:
    """The infinity norm of the N -> n Fourier truncation operator (its Lebesgue constant): how much it can amplify
    pointwise rounding errors of its input."""
    operator = pdes.fourier_resample(torch.eye(N, dtype=torch.float64), n, ndim=1)  # row j: the image of e_j, [N, n]
    return float(operator.abs().sum(0).max())


def band_limited(num: int, N: int, top: int, ndim: int, seed: int = 0) -> torch.Tensor:
    """Random real fields on N points per axis with modes |m| < top only (float64)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(num, *(N,) * ndim, generator=g, dtype=torch.float64)
    return pdes.fourier_resample(pdes.fourier_resample(u, 2 * top, ndim=ndim), N, ndim=ndim)


# ------------------------------------------------------------------------------------------------ Fourier resampling


@pytest.mark.parametrize("ndim", [1, 2])
def test_resampling_is_a_projection_and_exact_interpolation(ndim):
    u = band_limited(3, 64, 16, ndim)
    tol = 64 * EPS64 * float(u.abs().max()) * math.log2(64**ndim)  # float64 FFT rounding, a log N growth per transform
    up = pdes.fourier_resample(u, 128, ndim=ndim)
    torch.testing.assert_close(pdes.fourier_resample(up, 64, ndim=ndim), u, rtol=0, atol=tol)  # band-limited: exact
    # grid points of the 128 grid at even indices are the 64 grid's points (exact interpolation)
    even = up[..., ::2] if ndim == 1 else up[..., ::2, ::2]
    torch.testing.assert_close(even, u, rtol=0, atol=tol)
    rough = torch.randn(2, *(96,) * ndim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    once = pdes.fourier_resample(rough, 32, ndim=ndim)
    twice = pdes.fourier_resample(pdes.fourier_resample(rough, 64, ndim=ndim), 32, ndim=ndim)
    torch.testing.assert_close(twice, once, rtol=0, atol=64 * EPS64 * float(rough.abs().max()) * math.log2(96**ndim) * 96)


def test_resampling_refuses_ambiguous_shapes():
    with pytest.raises(InvalidInputError, match="even"):
        pdes.fourier_resample(torch.zeros(2, 64), 33, ndim=1)
    with pytest.raises(InvalidInputError, match="ndim"):
        pdes.fourier_resample(torch.zeros(2, 64, 32), 16, ndim=2)
    with pytest.raises(TypeError):
        pdes.fourier_resample(torch.zeros(2, 64), 32)  # ndim has no default: [B, N, N] could be 1-D or 2-D


# ------------------------------------------------------------------------------------------------- random fields


def test_random_fields_are_pure_functions_of_seed_and_index():
    a = pdes.gaussian_random_field(5, 48, seed=3, ndim=2)
    b = pdes.gaussian_random_field(2, 48, seed=3, ndim=2)
    assert torch.equal(a[:2], b)  # field i does not depend on how many are drawn
    assert not torch.allclose(pdes.gaussian_random_field(2, 48, seed=4, ndim=2), b)
    spectrum = torch.fft.rfft(pdes.gaussian_random_field(4, 96, seed=0, ndim=1)).abs()
    assert float(spectrum[:, 32:].max()) <= 96 * EPS64 * float(spectrum.max())  # nothing outside |m| < N / 3
    assert float(spectrum[:, 0].max()) <= 96 * EPS64 * float(spectrum.max())  # zero mean


def test_random_fields_have_the_asked_amplitude():
    u = pdes.gaussian_random_field(400, 96, seed=0, ndim=1, amplitude=0.5)
    mean_square = float(u.pow(2).mean())
    # 400 fields x (about 10 effective modes each): the sample mean square has a relative spread of about 2%
    assert abs(mean_square / 0.25 - 1) < 0.15, mean_square


# -------------------------------------------------------------------------------------------------------- Burgers


def cole_hopf(x: torch.Tensor, t: float, nu: float) -> torch.Tensor:
    """An exact viscous Burgers solution: u = -2 nu phi_x / phi with phi a solution of the heat equation, phi > 0."""
    modes = [(1, 0.6, 0.3), (2, 0.25, 1.1), (3, 0.1, 2.0)]  # (m, a, phase), sum of a < 1 keeps phi positive
    phi = 1.0 + sum(a * math.exp(-nu * (2 * math.pi * m) ** 2 * t) * torch.cos(2 * math.pi * m * x + th) for m, a, th in modes)
    dphi = sum(-a * 2 * math.pi * m * math.exp(-nu * (2 * math.pi * m) ** 2 * t) * torch.sin(2 * math.pi * m * x + th)
               for m, a, th in modes)
    return -2 * nu * dphi / phi


def test_burgers_matches_the_cole_hopf_solution():
    nu, N, n = 0.01, 384, 256
    x = torch.arange(N, dtype=torch.float64) / N
    times = [0.0, 0.05, 0.1, 0.2]
    result = pdes.solve_burgers(cole_hopf(x, 0.0, nu).unsqueeze(0), nu, times, resolutions=[n])
    assert result.at(n).dtype == torch.float32 and result.at(n).shape == (1, 4, n)
    scale = float(cole_hopf(x, 0.0, nu).abs().max())
    # The float64 solve is exact to ~1e-12 here (its spectrum is below 1e-16 at the band's edge; RK4 at cfl 1):
    # what remains is the rounding of the float32 output, eps32 / 2 per value, with a 4x margin.
    tol = 2 * EPS32 * scale
    for k, t in enumerate(times):
        exact = pdes.fourier_resample(cole_hopf(x, t, nu), n, ndim=1)
        torch.testing.assert_close(result.at(n)[0, k].double(), exact, rtol=0, atol=tol)
    # the comparison discriminates: the nonlinear term moves the solution by 1e-2, 5 orders above tol
    k = 2 * math.pi * torch.fft.rfftfreq(N, 1 / N, dtype=torch.float64)
    heat_only = torch.fft.irfft(torch.fft.rfft(cole_hopf(x, 0.0, nu)) * torch.exp(-nu * k**2 * 0.2), n=N)
    assert float((pdes.fourier_resample(heat_only, n, ndim=1) - pdes.fourier_resample(cole_hopf(x, 0.2, nu), n, ndim=1)).abs().max()) > 1e4 * tol


def test_burgers_conserves_the_mean():
    u0 = pdes.gaussian_random_field(4, 96, seed=1, ndim=1, amplitude=0.8) + 0.3
    result = pdes.solve_burgers(u0, 0.02, [0.0, 0.2, 0.4])
    u = result.at(64).double()
    # the solver keeps mode 0 exactly; the float32 values round by eps32 / 2 each, so their mean by at most that
    assert float((u.mean(-1) - 0.3).abs().max()) <= EPS32 * float(u.abs().max())
    assert float((u[:, -1] - u[:, 0]).abs().max()) > 0.01  # and the fields did evolve


def test_advection_diffusion_shifts_right_and_decays_exactly():
    # nu tiny: u(x, t) = u0(x - c t); c t = 1/4 moves a 64-point grid by 16 points
    data = pdes.advection_diffusion_1d(4, resolutions=(64,), velocity=1.0, viscosity=1e-12, t_final=0.25, num_times=2,
                                       use_cache=False)
    u = data.at(64)
    tol = 2 * EPS32 * float(u.abs().max())  # both sides are float32 roundings of the same value (decay 1e-8)
    torch.testing.assert_close(u[:, 1], torch.roll(u[:, 0], 16, dims=-1), rtol=0, atol=tol)
    nu = 0.01
    data = pdes.advection_diffusion_1d(4, resolutions=(64,), viscosity=nu, t_final=0.1, num_times=2, use_cache=False)
    spectra = torch.fft.rfft(data.at(64).double())  # [B, 2, 33]
    k = 2 * math.pi * torch.arange(33, dtype=torch.float64)
    # the modes' moduli decay by exp(-nu k^2 t); the float32 values perturb each rfft coefficient by at most
    # sum_j |rounding_j| <= 64 * eps32 / 2 * max|u|, on either side
    tol = 64 * EPS32 * float(data.at(64).abs().max())
    torch.testing.assert_close(spectra[:, 1].abs(), spectra[:, 0].abs() * torch.exp(-nu * k**2 * 0.1), rtol=0, atol=tol)


# -------------------------------------------------------------------------------------------------- Navier-Stokes


def test_navier_stokes_steady_euler_modes_decay_exactly():
    # Modes of one |m| (|m|^2 = 25): w is a multiple of psi, u . grad w = 0, so w(t) = w0 exp(-nu 4 pi^2 25 t).
    N, n, nu = 48, 32, 0.01
    x = torch.arange(N, dtype=torch.float64) / N
    X, Y = x.view(-1, 1), x.view(1, -1)
    modes = [(3, 4, 1.0, 0.2), (4, 3, -0.7, 1.3), (5, 0, 0.5, 2.0), (0, 5, 0.9, 0.1), (3, -4, -1.1, 0.7), (4, -3, 0.6, 2.9)]
    w0 = sum(c * torch.cos(2 * math.pi * (a * X + b * Y) + th) for a, b, c, th in modes).unsqueeze(0)
    times = [0.0, 0.1, 0.3]
    result = pdes.solve_navier_stokes(w0, nu, times, resolutions=[n])
    steps = result.diagnostics["steps"]
    for k, t in enumerate(times):
        exact = pdes.fourier_resample(w0[0] * math.exp(-nu * 4 * math.pi**2 * 25 * t), n, ndim=2)
        # stepped in float32: each of the `steps` RK4 updates and each float32 FFT (error ~ eps32 log2(N^2) of
        # the field's size) rounds; a factor 4 for the four stages
        tol = 4 * EPS32 * math.log2(N * N) * (1 + steps) * float(exact.abs().max())
        torch.testing.assert_close(result.at(n)[0, k].double(), exact, rtol=0, atol=tol)


def test_navier_stokes_advects_in_the_right_direction():
    # Shear w = A cos(2 pi y) plus eps cos(4 pi x): at t = 0, dw/dt = -(3/2) A eps sin(2 pi y) sin(4 pi x) (from
    # u = psi_y, v = -psi_x, -lap psi = w). A wrong sign or a wrong psi would change the coefficient's sign or size.
    N, n, A, eps, t = 48, 32, 1.0, 1e-3, 1e-2
    x = torch.arange(N, dtype=torch.float64) / N
    w0 = (A * torch.cos(2 * math.pi * x.view(1, -1)) + eps * torch.cos(4 * math.pi * x.view(-1, 1))).unsqueeze(0)
    w = pdes.solve_navier_stokes(w0, 1e-6, [0.0, t], resolutions=[n]).at(n)[0, 1].double()
    xs = torch.arange(n, dtype=torch.float64) / n
    basis = torch.sin(4 * math.pi * xs.view(-1, 1)) * torch.sin(2 * math.pi * xs.view(1, -1))
    coefficient = float((w * basis).sum() / (basis * basis).sum())
    # The Taylor remainder measured 0.13% at t = 1e-2 (and float32 rounding of the projection ~0.1% at 1e-3): 2% is
    # loose for a correct solver, while a flipped velocity gives -100% and a mis-scaled psi a different factor.
    assert coefficient / (-1.5 * A * eps * t) == pytest.approx(1.0, abs=0.02)


def test_navier_stokes_conserves_mean_vorticity():
    w0 = pdes.gaussian_random_field(2, 48, seed=2, ndim=2) + 0.25
    w = pdes.solve_navier_stokes(w0, 1e-3, [0.0, 0.2], forcing=pdes.fno_forcing(48)).at(32).double()
    assert float((w.mean((-1, -2)) - 0.25).abs().max()) <= EPS32 * float(w.abs().max())  # float32 rounding of the mean
    assert float((w[:, 1] - w[:, 0]).abs().max()) > 1e-3


# --------------------------------------------------------------------------------- datasets at several resolutions


@pytest.mark.parametrize("make, ndim", [
    (lambda: pdes.burgers_1d(6, resolutions=(32, 64, 128), t_final=0.1, num_times=3, use_cache=False), 1),
    (lambda: pdes.navier_stokes_2d(2, resolutions=(16, 32), t_final=0.1, num_times=2, use_cache=False), 2),
])
def test_each_resolution_is_the_fourier_truncation_of_the_next(make, ndim):
    data = make()
    assert data.ndim == ndim
    for coarse, fine in zip(data.resolutions, data.resolutions[1:]):
        u_fine, u_coarse = data.at(fine), data.at(coarse)
        assert u_coarse.shape == (*u_fine.shape[:2], *(coarse,) * ndim)
        # u_fine carries float32 rounding (eps32 / 2 per value), which the truncation amplifies by at most its
        # Lebesgue constant (per axis); u_coarse is itself rounded once more. Computed exactly, both are equal.
        growth = truncation_norm(fine, coarse) ** ndim
        tol = (growth + 1) * EPS32 / 2 * float(u_fine.abs().max()) * 2
        torch.testing.assert_close(pdes.fourier_resample(u_fine, coarse, ndim=ndim).double(), u_coarse.double(), rtol=0, atol=tol)
        assert data.spacing(coarse) == 1 / coarse and data.grid(coarse)[1] == 1 / coarse


def test_burgers_default_grid_has_content_up_to_each_nyquist_limit():
    data = pdes.burgers_1d(4, resolutions=(32, 64), t_final=0.02, num_times=2, use_cache=False)
    assert data.params["fine"] == 96
    spectrum = torch.fft.rfft(data.at(64)[:, 0].double()).abs()
    assert float(spectrum[:, 16:32].max()) > 1e-4 * float(spectrum.max())  # above the 32-grid's Nyquist limit


def test_generators_are_deterministic_and_cached(tmp_cache):
    kwargs = dict(num_trajectories=4, resolutions=(16, 32), t_final=0.05, num_times=3)
    first = pdes.burgers_1d(**kwargs)
    entries = list((cache_root() / pdes.CACHE_NAMESPACE).iterdir())
    assert len(entries) == 1
    again = pdes.burgers_1d(**kwargs)  # a hit: same tensors
    assert all(torch.equal(first.at(n), again.at(n)) for n in first.resolutions)
    assert again.diagnostics == first.diagnostics
    fresh = pdes.burgers_1d(**kwargs, use_cache=False)
    assert torch.equal(fresh.at(32), first.at(32))  # the solve is deterministic
    blob = entries[0] / "fields.safetensors"
    raw = bytearray(blob.read_bytes())
    raw[-8:] = b"\xff" * 8
    blob.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        rebuilt = pdes.burgers_1d(**kwargs)
    assert torch.equal(rebuilt.at(32), first.at(32))
    other = pdes.burgers_1d(**{**kwargs, "seed": 1})
    assert not torch.equal(other.at(32), first.at(32))


def test_pairs_and_shapes():
    data = pdes.advection_diffusion_1d(3, resolutions=(32,), num_times=5, use_cache=False)
    x, y = data.pairs(32)
    assert x.shape == y.shape == (3 * 4, 32)
    assert torch.equal(x[1], data.at(32)[0, 1]) and torch.equal(y[1], data.at(32)[0, 2])
    x2, _ = data.pairs(32, lag=4)
    assert x2.shape == (3, 32)
    with pytest.raises(InvalidInputError, match="lag"):
        data.pairs(32, lag=5)
    with pytest.raises(InvalidInputError, match="resolutions"):
        data.at(64)


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidInputError, match="even"):
        pdes.burgers_1d(2, resolutions=(33,))
    with pytest.raises(InvalidInputError, match="fine"):
        pdes.burgers_1d(2, resolutions=(64,), fine=64)
    with pytest.raises(InvalidInputError, match="viscosity"):
        pdes.burgers_1d(2, resolutions=(16,), viscosity=0.0)
    with pytest.raises(InvalidInputError, match="cfl"):
        pdes.navier_stokes_2d(2, resolutions=(16,), cfl=3.0)
    with pytest.raises(InvalidInputError, match="increasing"):
        pdes.solve_burgers(torch.zeros(1, 48), 0.01, [0.0, 0.2, 0.1])
    with pytest.raises(InvalidInputError, match="at most 32"):
        pdes.solve_burgers(torch.zeros(1, 48), 0.01, [0.0, 0.1], resolutions=[48])
    with pytest.raises(InvalidInputError, match="seed"):
        pdes.gaussian_random_field(2, 48, seed=-1)


def test_an_unresolved_solve_warns():
    with pytest.warns(UserWarning, match="not resolved"):
        data = pdes.burgers_1d(2, resolutions=(32,), viscosity=3e-4, amplitude=1.0, t_final=0.3, num_times=2, use_cache=False)
    assert data.diagnostics["band_tail"] > pdes.TAIL_WARNING
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pdes.burgers_1d(2, resolutions=(32,), t_final=0.05, num_times=2, use_cache=False)  # the defaults resolve
