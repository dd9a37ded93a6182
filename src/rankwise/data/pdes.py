"""PDE trajectories generated in code (no data files): periodic fields on the unit interval or square, solved once
on a fine grid and handed out at several resolutions, every coarse one the Fourier truncation of the same fine
solution, so the 32-, 64- and 128-point versions of trajectory i are one physical trajectory seen under three
Nyquist limits (what zero-shot super-resolution needs: train at 64, evaluate at 128 against the real fine data).

    data = burgers_1d(256, resolutions=(32, 64, 128, 256), seed=0)
    data.at(64)               # [256, T, 64] float32: u(x_j, t_k) with x_j = j / 64, t_k = data.times[k]
    x, y = data.pairs(64)     # one-step forecasting pairs: u(t_k) -> u(t_{k+1}), each [256 * (T - 1), 64]
    ns = navier_stokes_2d(256, resolutions=(32, 64), seed=0)
    ns.at(64)                 # [256, T, 64, 64] float32 vorticity w(x_i, y_j, t_k), x along dim -2, y along dim -1

Equations (domain [0, 1)^d, periodic; wavenumbers k = 2 pi m for integer modes m):
- `burgers_1d`: u_t + u u_x = nu u_xx (viscous Burgers).
- `advection_diffusion_1d`: u_t + c u_x = nu u_xx, solved exactly in Fourier space (a linear, clean mechanism test).
- `navier_stokes_2d`: the 2-D incompressible Navier-Stokes equations in vorticity form,
  w_t + u . grad w = nu lap w + f, with u = (psi_y, -psi_x), -lap psi = w, and the forcing of Li et al.'s FNO data,
  f = 0.1 (sin 2 pi (x + y) + cos 2 pi (x + y)).

Solver (`solve_burgers`, `solve_navier_stokes` for initial fields of your own): Fourier pseudo-spectral with the
2/3 rule (the state keeps the modes |m| < N/3 on every axis, the nonlinear term is computed on the N-point grid and
truncated to them, which is alias-free), and fourth-order integrating-factor Runge-Kutta: the viscous term is
integrated exactly, so the step is bounded by advection only (a CFL number times 1 / (max speed x largest
wavenumber), re-chosen at every output interval). Burgers runs in float64, Navier-Stokes in float32 (see
`_navier_stokes`). The default fine grid is N = 3/2 the largest resolution asked for, so that resolution's every
mode up to its Nyquist limit is computed (and `diagnostics["band_tail"]` warns when N does not resolve the flow).

Cost on one core: the default Burgers set (256 trajectories, fine grid 384) about 3 s; the default Navier-Stokes set
(256 trajectories at 32 and 64, fine grid 96, t = 0..1) about 20 s, both once: later calls load them from the cache.
The Navier-Stokes defaults take Li et al.'s viscosity, forcing and initial spectrum shape, but rms vorticity 1 and
a horizon of 1 time unit (theirs: 50): long horizons cost proportionally more steps.

Initial conditions: Gaussian random fields with spectrum S(m) proportional to (1 + |m|^2 / corner^2)^(-decay) (flat
below `corner` modes, decaying as |m|^(-2 decay) above), zero mean, scaled to root-mean-square `amplitude`; field i
is a pure function of (seed, i, fine grid, spectrum): it does not depend on how many trajectories are drawn.

Results are cached (`core.cache`, keyed by every argument), so a repeated call costs a load, not a solve.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, read_json, save_tensors_atomic, write_json_atomic
from rankwise.core.progress import progress
from rankwise.core.spectral import fourier_resample, from_spectrum  # noqa: F401  (fourier_resample: re-exported)
from rankwise.core.spectral import irfft as _irfft
from rankwise.core.spectral import rfft as _rfft
from rankwise.errors import CorruptFileError, InvalidInputError, NumericalError

CACHE_NAMESPACE = "pdes"
CACHE_VERSION = 1
TAIL_WARNING = 1e-6  # band_tail above this: the fine grid does not resolve the solution (see `_band_tail`)
# A solver's result: {resolution: float32 fields [B, T, n...]}, times float64 [T], diagnostics.
Solution = tuple[dict[int, torch.Tensor], torch.Tensor, dict[str, Any]]


@dataclass(frozen=True)
class PDETrajectories:
    """Snapshots of `num_trajectories` solutions at `times` [T] (float64), at each resolution n:
    `fields[n]` float32 [B, T, n] (1-D) or [B, T, n, n] (2-D), grid spacing 1 / n, point j at x_j = j / n."""

    name: str
    fields: dict[int, torch.Tensor]
    times: torch.Tensor
    params: dict[str, Any] = field(default_factory=dict)
    # solver steps (the most any chunk took), band_tail: the edge-of-band energy share the dynamics built up (0.0:
    # none beyond the initial field's; above TAIL_WARNING the fine grid does not resolve the solution; `_band_tail`)
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def resolutions(self) -> tuple[int, ...]:
        return tuple(sorted(self.fields))

    @property
    def ndim(self) -> int:
        """Spatial dimensions (1 or 2)."""
        return next(iter(self.fields.values())).dim() - 2

    @property
    def num_trajectories(self) -> int:
        return next(iter(self.fields.values())).size(0)

    def at(self, resolution: int) -> torch.Tensor:
        """The fields on the `resolution`-point grid: [B, T, n] or [B, T, n, n]."""
        if resolution not in self.fields:
            raise InvalidInputError(f"{self.name} was generated at resolutions {list(self.resolutions)}, not {resolution}; "
                                    "ask for it in `resolutions` (it is cut from the same fine solution)")
        return self.fields[resolution]

    def spacing(self, resolution: int) -> float:
        """Grid spacing dx = 1 / n of the `resolution`-point grid (the domain has unit length)."""
        return 1.0 / self.at(resolution).size(-1)

    def grid(self, resolution: int) -> torch.Tensor:
        """Coordinates x_j = j / n, float64 [n], of the grid points along each axis."""
        return torch.arange(self.at(resolution).size(-1), dtype=torch.float64) * self.spacing(resolution)

    def pairs(self, resolution: int, lag: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """One-step forecasting pairs (u(t_k), u(t_{k+lag})), each [B * (T - lag), n] (or [.., n, n]), trajectory-major."""
        u = self.at(resolution)
        if not 1 <= lag < u.size(1):
            raise InvalidInputError(f"lag must be in 1..{u.size(1) - 1} (there are {u.size(1)} snapshots), got {lag}")
        tail = u.shape[2:]
        return u[:, :-lag].reshape(-1, *tail), u[:, lag:].reshape(-1, *tail)


# -------------------------------------------------------------------------------------------- random initial fields


def gaussian_random_field(num: int, fine: int, seed: int, ndim: int = 1, amplitude: float = 1.0, corner: float = 4.0,
                          decay: float = 2.0) -> torch.Tensor:
    """`num` zero-mean periodic Gaussian random fields, float64 [num, fine] or [num, fine, fine], with the spectrum
    of the module docstring restricted to the modes |m| < fine / 3 (the solver's band) and expected mean square
    `amplitude`^2. Field i comes from white noise drawn by numpy's generator seeded with (seed, i): portable across
    CPUs and independent of `num`."""
    if num < 1 or fine < 6 or fine % 2 or seed < 0 or not (amplitude > 0 and corner > 0 and decay > 0):
        raise InvalidInputError(f"need num >= 1, an even fine grid >= 6, seed >= 0 and positive amplitude, corner and "
                                f"decay; got num={num}, fine={fine}, seed={seed}, amplitude={amplitude}, corner={corner}, decay={decay}")
    shape = (fine,) * ndim
    noise = torch.from_numpy(np.stack([np.random.default_rng([seed, i]).standard_normal(shape) for i in range(num)]))
    m2, band = _mode_squares(fine, ndim)
    spectrum = torch.where(band & (m2 > 0), (1.0 + m2 / corner**2) ** (-decay), torch.zeros_like(m2))
    spectrum = spectrum * (amplitude**2 / float((spectrum * _half_grid_weights(fine)).sum()))
    # White noise has E|rfft(noise)_m|^2 = fine^ndim, so scaling its modes by sqrt(S_m) gives E[u^2] = sum_m S_m.
    coloured = _rfft(noise, ndim) * torch.sqrt(spectrum) * math.sqrt(fine**ndim)
    return _irfft(coloured, fine, ndim)


# --------------------------------------------------------------------------------------------------------- equations


def burgers_1d(num_trajectories: int = 256, resolutions: Sequence[int] = (32, 64, 128, 256), seed: int = 0,
               viscosity: float = 0.01, t_final: float = 0.5, num_times: int = 51, fine: int | None = None,
               amplitude: float = 0.5, corner: float = 3.0, decay: float = 2.0, cfl: float = 1.0,
               use_cache: bool = True) -> PDETrajectories:
    """Viscous Burgers u_t + u u_x = nu u_xx from random initial fields; snapshots at `num_times` equally spaced times
    in [0, t_final] (t = 0 included). fields[n]: float32 [num_trajectories, num_times, n]."""
    params = dict(equation="burgers-1d", num_trajectories=num_trajectories, resolutions=_check_resolutions(resolutions),
                  seed=seed, viscosity=viscosity, t_final=t_final, num_times=num_times, fine=_fine_grid(resolutions, fine),
                  amplitude=amplitude, corner=corner, decay=decay, cfl=cfl)
    return _cached(params, use_cache, _solve_burgers)


def advection_diffusion_1d(num_trajectories: int = 256, resolutions: Sequence[int] = (32, 64, 128, 256), seed: int = 0,
                           velocity: float = 1.0, viscosity: float = 0.002, t_final: float = 0.5, num_times: int = 51,
                           fine: int | None = None, amplitude: float = 0.5, corner: float = 3.0, decay: float = 1.5,
                           use_cache: bool = True) -> PDETrajectories:
    """u_t + c u_x = nu u_xx, exact: each mode m is multiplied by exp((-nu k^2 - i c k) t), k = 2 pi m. The default
    decay (spectrum ~ m^-3) leaves energy above a 64-point grid's Nyquist limit. fields[n]: float32 [B, T, n]."""
    params = dict(equation="advection-diffusion-1d", num_trajectories=num_trajectories,
                  resolutions=_check_resolutions(resolutions), seed=seed, velocity=velocity, viscosity=viscosity,
                  t_final=t_final, num_times=num_times, fine=_fine_grid(resolutions, fine), amplitude=amplitude,
                  corner=corner, decay=decay)
    return _cached(params, use_cache, _solve_advection_diffusion)


def navier_stokes_2d(num_trajectories: int = 256, resolutions: Sequence[int] = (32, 64), seed: int = 0,
                     viscosity: float = 1e-3, t_final: float = 1.0, num_times: int = 11, fine: int | None = None,
                     amplitude: float = 1.0, corner: float = 1.1, decay: float = 2.5, forcing: bool = True,
                     cfl: float = 1.0, use_cache: bool = True) -> PDETrajectories:
    """2-D Navier-Stokes vorticity from random initial vorticity (the defaults follow Li et al.'s FNO data: nu 1e-3,
    their forcing, spectrum corner 7 / 2 pi and decay 2.5). fields[n]: float32 [B, T, n, n], w(x_i, y_j) at [.., i, j]."""
    params = dict(equation="navier-stokes-2d", num_trajectories=num_trajectories,
                  resolutions=_check_resolutions(resolutions), seed=seed, viscosity=viscosity, t_final=t_final,
                  num_times=num_times, fine=_fine_grid(resolutions, fine), amplitude=amplitude, corner=corner,
                  decay=decay, forcing=forcing, cfl=cfl)
    return _cached(params, use_cache, _solve_navier_stokes)


def solve_burgers(u0: torch.Tensor, viscosity: float, times: Sequence[float] | torch.Tensor,
                  resolutions: Sequence[int] | None = None, cfl: float = 1.0) -> PDETrajectories:
    """Viscous Burgers from given initial fields u0 [B, N] (on x_j = j / N, any float dtype; solved in float64)
    until each of `times` (increasing, the first the time of u0). u0 is first projected onto the solver's band
    |m| < N / 3. Default resolution: the largest grid that band fills, 2 ceil(N / 3)."""
    if u0.dim() != 2:
        raise InvalidInputError(f"u0 must be [B, N], got {tuple(u0.shape)}")
    p = _solver_params("burgers-1d", u0.size(-1), viscosity, cfl, resolutions)
    return _solution(p, _burgers(u0, p, _check_times(times)))


def solve_navier_stokes(w0: torch.Tensor, viscosity: float, times: Sequence[float] | torch.Tensor,
                        forcing: torch.Tensor | None = None, resolutions: Sequence[int] | None = None,
                        cfl: float = 1.0) -> PDETrajectories:
    """2-D Navier-Stokes from given initial vorticity w0 [B, N, N] (w(x_i, y_j) at [b, i, j]; solved in float32)
    until each of `times`; `forcing` f [N, N] (default none; `fno_forcing(N)` is Li et al.'s). w0 and f are first
    projected onto the band |m_x|, |m_y| < N / 3. Default resolution: 2 ceil(N / 3), as `solve_burgers`."""
    if w0.dim() != 3 or w0.size(-1) != w0.size(-2):
        raise InvalidInputError(f"w0 must be [B, N, N], got {tuple(w0.shape)}")
    if forcing is not None and tuple(forcing.shape) != tuple(w0.shape[1:]):
        raise InvalidInputError(f"forcing must be [N, N] = {tuple(w0.shape[1:])}, got {tuple(forcing.shape)}")
    p = _solver_params("navier-stokes-2d", w0.size(-1), viscosity, cfl, resolutions)
    return _solution(p, _navier_stokes(w0, p, _check_times(times), forcing))


def fno_forcing(n: int) -> torch.Tensor:
    """f(x, y) = 0.1 (sin 2 pi (x + y) + cos 2 pi (x + y)) on the n x n grid, float64 [n, n] (Li et al. 2021)."""
    x = torch.arange(n, dtype=torch.float64) / n
    phase = 2 * math.pi * (x.view(-1, 1) + x.view(1, -1))
    return 0.1 * (torch.sin(phase) + torch.cos(phase))


def _solve_burgers(p: dict[str, Any]) -> Solution:
    u0 = gaussian_random_field(p["num_trajectories"], p["fine"], p["seed"], 1, p["amplitude"], p["corner"], p["decay"])
    return _burgers(u0, p, _output_times(p))


def _solve_navier_stokes(p: dict[str, Any]) -> Solution:
    w0 = gaussian_random_field(p["num_trajectories"], p["fine"], p["seed"], 2, p["amplitude"], p["corner"], p["decay"])
    return _navier_stokes(w0, p, _output_times(p), fno_forcing(p["fine"]) if p["forcing"] else None)


def _solve_advection_diffusion(p: dict[str, Any]) -> Solution:
    N = p["fine"]
    u0 = gaussian_random_field(p["num_trajectories"], N, p["seed"], 1, p["amplitude"], p["corner"], p["decay"])
    k = 2 * math.pi * torch.fft.rfftfreq(N, 1.0 / N, dtype=torch.float64)
    times = _output_times(p)
    rate = -p["viscosity"] * k**2 - 1j * p["velocity"] * k  # [N/2 + 1]
    u_hat = torch.fft.rfft(u0).unsqueeze(1) * torch.exp(rate * times.view(-1, 1))  # [B, T, N/2 + 1]
    return {n: from_spectrum(u_hat, N, n, 1).float() for n in p["resolutions"]}, times, {"steps": 0}


def _burgers(u0: torch.Tensor, p: dict[str, Any], times: torch.Tensor) -> Solution:
    N = p["fine"]
    k = 2 * math.pi * torch.fft.rfftfreq(N, 1.0 / N, dtype=torch.float64)
    mask = _mode_squares(N, 1)[1]
    ik = 1j * k

    def nonlinear(u_hat: torch.Tensor) -> torch.Tensor:  # -(u^2 / 2)_x, truncated to the band (2/3 rule)
        u = torch.fft.irfft(u_hat, n=N)
        return -0.5 * ik * torch.fft.rfft(u * u) * mask

    def speed(u_hat: torch.Tensor) -> float:
        return float(torch.fft.irfft(u_hat, n=N).abs().max())

    u_hat = torch.fft.rfft(u0.double()) * mask
    return _integrate(u_hat, -p["viscosity"] * k**2, nonlinear, speed, p, times, chunk=32)


def _navier_stokes(w0: torch.Tensor, p: dict[str, Any], times: torch.Tensor, forcing: torch.Tensor | None) -> Solution:
    N = p["fine"]
    # Stepped in float32 (complex64): its FFTs are 3x faster than float64's here, and its rounding (a relative 1e-7
    # per step, growing like the square root of the steps) is the float32 rounding the returned fields carry anyway.
    real, cplx = torch.float32, torch.complex64
    mask = _mode_squares(N, 2)[1]
    kx = (2 * math.pi * torch.fft.fftfreq(N, 1.0 / N, dtype=torch.float64)).view(-1, 1)
    ky = (2 * math.pi * torch.fft.rfftfreq(N, 1.0 / N, dtype=torch.float64)).view(1, -1)
    k2 = kx**2 + ky**2
    inverse_laplacian = torch.where(k2 > 0, 1.0 / k2.clamp_min(1e-30), torch.zeros_like(k2))  # psi_hat = w_hat / k^2
    # Spectral multipliers taking w_hat to the spectra of u = psi_y, v = -psi_x, w_x and w_y: [4, 1, N, N/2 + 1].
    multipliers = torch.stack([1j * ky * inverse_laplacian, -1j * kx * inverse_laplacian, 1j * kx + 0 * ky,
                               1j * ky + 0 * kx]).unsqueeze(1).to(cplx)
    f_hat = (torch.fft.rfft2(forcing.double()) * mask).to(cplx) if forcing is not None else None
    band = mask.to(real)

    def velocity_and_gradient(w_hat: torch.Tensor) -> torch.Tensor:  # [4, B, N, N]: u, v, w_x, w_y
        return torch.fft.irfft2(multipliers * w_hat, s=(N, N))

    def nonlinear(w_hat: torch.Tensor) -> torch.Tensor:  # -(u . grad w), truncated to the band, plus the forcing
        u, v, wx, wy = velocity_and_gradient(w_hat)
        advection = -torch.fft.rfft2(u * wx + v * wy) * band
        advection[..., 0, 0] = 0  # exactly 0 (the mean of u . grad w = div(u w)); rounding would drift the mean
        return advection if f_hat is None else advection + f_hat

    def speed(w_hat: torch.Tensor) -> float:
        u, v = velocity_and_gradient(w_hat)[:2]
        return float((u.abs() + v.abs()).max())

    w_hat = (torch.fft.rfft2(w0.double()) * mask).to(cplx)
    return _integrate(w_hat, (-p["viscosity"] * k2).to(real), nonlinear, speed, p, times, chunk=8)


# ----------------------------------------------------------------------------------------------------- time stepping


def _integrate(u_hat: torch.Tensor, linear: torch.Tensor, nonlinear: Callable[[torch.Tensor], torch.Tensor],
               speed: Callable[[torch.Tensor], float], p: dict[str, Any], times: torch.Tensor, chunk: int) -> Solution:
    """Integrating-factor RK4 (Trefethen, Spectral Methods in MATLAB, p27) for u_hat' = linear * u_hat + N(u_hat),
    with `linear` diagonal: exact for the linear part, fourth order for N. Returns the snapshots at each resolution
    (see `_snapshots`), the times [T] and diagnostics.

    Trajectories are stepped in chunks of `chunk` (consecutive indices): small batches keep the FFTs in cache (2x
    faster than one large batch here), and each chunk picks its own step size, so trajectory i depends on its chunk
    only, and on it by time-stepping error only (below float32 rounding at the default cfl)."""
    parts = [_integrate_chunk(u_hat[i : i + chunk], linear, nonlinear, speed, p, times)
             for i in progress(range(0, u_hat.size(0), chunk), desc=p["equation"])]
    fields = {n: torch.cat([part[0][n] for part in parts]) for n in p["resolutions"]}
    return fields, times, {"steps": max(part[1] for part in parts), "band_tail": max(part[2] for part in parts)}


def _integrate_chunk(u_hat: torch.Tensor, linear: torch.Tensor, nonlinear: Callable[[torch.Tensor], torch.Tensor],
                     speed: Callable[[torch.Tensor], float], p: dict[str, Any],
                     times: torch.Tensor) -> tuple[dict[int, torch.Tensor], int, float]:
    """One chunk [b, ...] from times[0] to times[-1]: its snapshots, its step count and its band tail."""
    k_max = _band_wavenumber(p["fine"])
    snapshots = [_snapshots(u_hat, p)]
    total_steps, initial_tail, tail = 0, _band_tail(u_hat, p["fine"]), 0.0
    for t0, t1 in zip(times[:-1].tolist(), times[1:].tolist()):
        fastest = speed(u_hat)
        if not math.isfinite(fastest):
            raise NumericalError(f"{p['equation']}: the solution blew up before t={t0:g}; lower cfl or the amplitude")
        limit = p["cfl"] / max(fastest * k_max, 1e-12)
        steps = max(1, math.ceil((t1 - t0) / limit))
        h = (t1 - t0) / steps
        e_half, e_full = (torch.exp(linear.double() * t).to(linear.dtype) for t in (h / 2, h))
        for _ in range(steps):
            a = h * nonlinear(u_hat)
            b = h * nonlinear(e_half * (u_hat + a / 2))
            c = h * nonlinear(e_half * u_hat + b / 2)
            d = h * nonlinear(e_full * u_hat + e_half * c)
            u_hat = e_full * u_hat + (e_full * a + 2 * e_half * (b + c) + d) / 6
        total_steps += steps
        tail = max(tail, _band_tail(u_hat, p["fine"]))
        snapshots.append(_snapshots(u_hat, p))
    fields = {n: torch.stack([s[n] for s in snapshots], dim=1) for n in p["resolutions"]}
    if not all(bool(torch.isfinite(u).all()) for u in fields.values()):
        raise NumericalError(f"{p['equation']}: the solution is not finite; lower cfl or the amplitude")
    # Only energy the dynamics moved to the band's edge counts: a rough initial field that merely decays is resolved.
    return fields, total_steps, tail if tail > 2 * initial_tail else 0.0


def _band_tail(u_hat: torch.Tensor, N: int) -> float:
    """The largest share, over the batch, of a solution's energy (its mean excluded) in the top sixth of the band
    (modes with some |m_i| > 5/6 of the largest kept one). A resolved solution's spectrum has died out well before
    the band's edge; energy piling up there (more than twice the initial field's share, see `_integrate_chunk`)
    means the fine grid is too coarse for the viscosity."""
    ndim = u_hat.dim() - 1
    m = torch.fft.rfftfreq(N, 1.0 / N, dtype=torch.float64).abs()
    if ndim == 2:
        m = torch.maximum(torch.fft.fftfreq(N, 1.0 / N, dtype=torch.float64).abs().view(-1, 1), m.view(1, -1))
    energy = u_hat.abs().double() ** 2 * _half_grid_weights(N)
    energy = energy * (m > 0)
    top = (energy * (m > 5 / 6 * (math.ceil(N / 3) - 1))).flatten(1).sum(1)
    return float((top / energy.flatten(1).sum(1).clamp_min(1e-300)).max())


def _snapshots(u_hat: torch.Tensor, p: dict[str, Any]) -> dict[int, torch.Tensor]:
    """The fine state's spectrum [B, ...] as float32 grid values at every requested resolution: {n: [B, n...]}.
    Only the truncations are kept, never the fine grid (at N = 192 in 2-D it would be 0.8 GB per 256 trajectories)."""
    ndim = u_hat.dim() - 1
    return {n: from_spectrum(u_hat, p["fine"], n, ndim).float() for n in p["resolutions"]}


def _output_times(p: dict[str, Any]) -> torch.Tensor:
    return torch.linspace(0.0, p["t_final"], p["num_times"], dtype=torch.float64)


# ------------------------------------------------------------------------------------------------------------ helpers


def _cached(p: dict[str, Any], use_cache: bool, solve: Callable[[dict[str, Any]], Solution]) -> PDETrajectories:
    _check_params(p)
    key = cache_key(**p, version=CACHE_VERSION)
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            tensors = load_tensors(entry / "fields.safetensors")
            meta = read_json(entry / "params.json")
            if meta["params"] == p:
                return _trajectories(p, {n: tensors[f"n{n}"] for n in p["resolutions"]}, tensors["times"], meta["diagnostics"])
        except (CorruptFileError, KeyError, TypeError):
            pass  # another version's layout: solve again
    fields, times, diagnostics = solve(p)
    _warn_if_unresolved(p, diagnostics)
    if use_cache:
        def write(tmp):
            save_tensors_atomic(tmp / "fields.safetensors", {"times": times, **{f"n{n}": u for n, u in fields.items()}})
            write_json_atomic(tmp / "params.json", {"params": p, "diagnostics": diagnostics})
        store_entry(CACHE_NAMESPACE, key, write)
    return _trajectories(p, fields, times, diagnostics)


def _solution(p: dict[str, Any], solution: Solution) -> PDETrajectories:
    _warn_if_unresolved(p, solution[2])
    return _trajectories(p, *solution)


def _warn_if_unresolved(p: dict[str, Any], diagnostics: dict[str, Any]) -> None:
    if diagnostics.get("band_tail", 0.0) > TAIL_WARNING:
        warnings.warn(f"{p['equation']}: {diagnostics['band_tail']:.1e} of a solution's energy sits at the edge of the "
                      f"solver's band (fine={p['fine']}): the smallest scales are not resolved. Raise fine (the grid of "
                      "the initial field) or the viscosity, or lower the amplitude", stacklevel=4)


def _solver_params(equation: str, N: int, viscosity: float, cfl: float, resolutions: Sequence[int] | None) -> dict[str, Any]:
    if N < 6 or N % 2:
        raise InvalidInputError(f"{equation}: the initial field's grid must be even and >= 6 points per axis, got {N}")
    full = 2 * math.ceil(N / 3)  # the largest grid whose every mode below its Nyquist limit lies in the band
    res = _check_resolutions(resolutions if resolutions is not None else [full])
    if max(res) > full:
        raise InvalidInputError(f"{equation}: a {N}-point solve fills grids of at most {full} points (it keeps |m| < N / 3); "
                                f"got resolutions {res}: give the initial field on >= {3 * max(res) // 2} points")
    p = dict(equation=equation, viscosity=viscosity, cfl=cfl, fine=N, resolutions=res)
    _check_physics(p)
    return p


def _check_times(times: Sequence[float] | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(times, dtype=torch.float64).flatten()
    if t.numel() < 2 or not bool((t[1:] > t[:-1]).all()) or not bool(torch.isfinite(t).all()):
        raise InvalidInputError(f"times must be at least two finite, strictly increasing values (the first the initial "
                                f"field's), got {t.tolist()}")
    return t


def _trajectories(p: dict[str, Any], fields: dict[int, torch.Tensor], times: torch.Tensor,
                  diagnostics: dict[str, Any]) -> PDETrajectories:
    return PDETrajectories(p["equation"], dict(sorted(fields.items())), times, dict(p), dict(diagnostics))


def _check_resolutions(resolutions: Sequence[int]) -> list[int]:
    res = sorted({int(n) for n in resolutions})
    if not res or any(n < 4 or n % 2 for n in res):
        raise InvalidInputError(f"resolutions must be even grid sizes >= 4, got {list(resolutions)}")
    return res


def _fine_grid(resolutions: Sequence[int], fine: int | None) -> int:
    top = max(_check_resolutions(resolutions))
    need = 3 * top // 2 + (3 * top // 2) % 2  # the band |m| < N/3 then covers every mode below top / 2
    if fine is None:
        return need
    if fine < need or fine % 2:
        raise InvalidInputError(f"fine={fine} cannot give a {top}-point grid all its modes: the solver keeps |m| < fine / 3, "
                                f"so use an even fine >= {need} (3/2 of the largest resolution), or omit it")
    return int(fine)


def _check_params(p: dict[str, Any]) -> None:
    if p["num_trajectories"] < 1 or p["num_times"] < 2 or not p["t_final"] > 0:
        raise InvalidInputError(f"{p['equation']}: need num_trajectories >= 1, num_times >= 2 and t_final > 0, got "
                                f"{p['num_trajectories']}, {p['num_times']}, {p['t_final']}")
    _check_physics(p)


def _check_physics(p: dict[str, Any]) -> None:
    if not p["viscosity"] > 0:
        raise InvalidInputError(f"{p['equation']}: viscosity must be positive (the solver is not for inviscid flow), got {p['viscosity']}")
    if "cfl" in p and not 0 < p["cfl"] <= 2.0:
        raise InvalidInputError(f"{p['equation']}: cfl must be in (0, 2] (RK4 is unstable for advection beyond 2.8), got {p['cfl']}")


def _mode_squares(N: int, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """|m|^2 on the rfft grid of an N-point (N x N) grid, float64, and the band mask |m_i| < N / 3 on every axis."""
    last = torch.fft.rfftfreq(N, 1.0 / N, dtype=torch.float64)
    if ndim == 1:
        return last**2, last.abs() < N / 3
    first = torch.fft.fftfreq(N, 1.0 / N, dtype=torch.float64).view(-1, 1)
    last = last.view(1, -1)
    return first**2 + last**2, (first.abs() < N / 3) & (last.abs() < N / 3)


def _band_wavenumber(N: int) -> float:
    """The largest wavenumber 2 pi m the band holds (it bounds the advective frequency |u| k of any kept mode)."""
    return 2 * math.pi * math.ceil(N / 3 - 1)


def _half_grid_weights(N: int) -> torch.Tensor:
    """[N/2 + 1]: how many modes each rfft column stands for (0 < m_last < N/2: both m and -m)."""
    weights = torch.full((N // 2 + 1,), 2.0, dtype=torch.float64)
    weights[0] = weights[-1] = 1.0
    return weights
