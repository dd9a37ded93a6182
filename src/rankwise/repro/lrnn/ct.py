"""Reproduction `lrnn:ct`: sparse-view CT of the Shepp-Logan phantom. An INR mu(x, y) (2-layer LRNN, or SIREN at
matched parameters) is fitted through the differentiable Radon transform to a 30-angle sinogram, and compared with
filtered back-projection (`skimage.transform.iradon`, ramp filter) on PSNR and SSIM against the phantom (card E4).

The sinogram is skimage's `radon` of the phantom (N x N, zeroed outside the reconstruction circle); 10% of its entries
are held out as the validation split that tunes each INR's learning rate. FBP uses the whole sinogram.
"""

from __future__ import annotations

import statistics as st
from dataclasses import dataclass

import numpy as np
import torch

from rankwise.core.discrimination import comparison
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.report import Report
from rankwise.nn.lrnn import LRNN, Siren, circle_mask, lrnn_parameter_count, radon_transform, siren_parameter_count
from rankwise.repro.lrnn.fitting import (
    Arm, compare_arms, fit, grid_coords, held_out_mask, matched_width, parameter_count, psnr,
)
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    n: int
    angles: int
    ranks: tuple[int, ...]
    proj_dim: int
    hidden: int
    steps: int
    lr_grid: tuple[float, ...]
    seeds: int


SIZES = BySize(
    smoke=Settings(n=16, angles=6, ranks=(4, 4), proj_dim=4, hidden=2, steps=20, lr_grid=(1e-3, 3e-3), seeds=3),
    full=Settings(n=64, angles=30, ranks=(16, 16), proj_dim=8, hidden=4, steps=500, lr_grid=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
                  seeds=3),
)
RADON_TOL = 1e-10  # float64 agreement of our operator with skimage's: rounding of N-term sums


def phantom(n: int) -> np.ndarray:
    """Shepp-Logan resized to [n, n] in [0, 1], zero outside the reconstruction circle (float64)."""
    from skimage.data import shepp_logan_phantom
    from skimage.transform import resize

    img = resize(shepp_logan_phantom(), (n, n), anti_aliasing=True)
    return np.clip(img, 0.0, 1.0) * circle_mask(n, torch.float64).numpy()


def _ssim(a: np.ndarray, b: np.ndarray) -> float:
    from skimage.metrics import structural_similarity

    return float(structural_similarity(a, b, data_range=1.0, win_size=7))


def run(size: str = "smoke", seed: int = 0) -> Report:
    from skimage.transform import iradon, radon

    s = SIZES[size]
    report = Report("lrnn", "Sparse-view CT: LRNN and SIREN INRs through a differentiable Radon vs FBP", size, seed)
    report.declare(PairedClaim("lrnn_beats_siren_psnr", "PSNR(LRNN) - PSNR(SIREN) against the phantom, dB, paired by "
                               "seed", ">", 0.0, kind=ClaimKind.PAPER))
    # FBP is deterministic (one reconstruction for every seed): a comparison with it, measured in the same run
    report.declare(SampleClaim("lrnn_beats_fbp_psnr", "per-seed PSNR(LRNN) - PSNR(FBP), dB", ">", 0.0,
                               kind=ClaimKind.PAPER, discriminates=comparison("FBP")))
    report.declare(SampleClaim("lrnn_beats_fbp_ssim", "per-seed SSIM(LRNN) - SSIM(FBP)", ">", 0.0, kind=ClaimKind.PAPER,
                               discriminates=comparison("FBP")))
    report.declare(Claim("radon_matches_skimage", "max |radon_transform - skimage radon| / max |sinogram|, float64",
                         "<=", RADON_TOL, kind=ClaimKind.INVARIANT))
    report.declare(Claim("no_run_diverged", "non-finite losses over all fits", "<=", 0, kind=ClaimKind.SANITY))

    truth = phantom(s.n)
    theta = np.linspace(0.0, 180.0, s.angles, endpoint=False)
    sino64 = radon(truth, theta, circle=True)
    ours64 = radon_transform(torch.tensor(truth), torch.tensor(theta)).numpy()
    report.measure("radon_matches_skimage", float(np.abs(ours64 - sino64).max() / np.abs(sino64).max()))
    sino = torch.tensor(sino64, dtype=torch.float32)
    angles = torch.tensor(theta, dtype=torch.float32)
    val = held_out_mask(sino.numel(), 0.1, seed).reshape(sino.shape)
    tr = ~val
    coords = grid_coords(s.n)
    mask = circle_mask(s.n)
    scale = float(sino.abs().max())  # keeps the loss O(1); Adam does not care, the logs do

    def image(m):
        return m(coords).reshape(s.n, s.n) * mask

    n_lrnn = lrnn_parameter_count(2, 1, s.ranks, s.proj_dim, s.hidden)
    width = matched_width(n_lrnn, lambda w: siren_parameter_count(2, 1, w, 3))
    arm_list = (Arm("LRNN", lambda sd: LRNN(2, 1, s.ranks, s.proj_dim, s.hidden, omega0=30.0)),
                Arm(f"SIREN (width {width})", lambda sd: Siren(2, 1, width, 3, omega0=30.0)))
    counts = {a.name: parameter_count(a.build(0)) for a in arm_list}
    diverged = 0

    def train(model, lr):
        nonlocal diverged
        res = fit(model, lambda m: ((radon_transform(image(m), angles) - sino)[tr] / scale).pow(2).mean(), s.steps, lr,
                  log_every=s.steps)
        diverged += int(res.diverged)
        return res

    def val_mse(m):
        with torch.no_grad():
            return float(((radon_transform(image(m), angles) - sino)[val] / scale).double().pow(2).mean())

    def evaluate(res):
        with torch.no_grad():
            rec = image(res.model).double().numpy()
        return {"psnr": psnr(torch.tensor(rec), torch.tensor(truth)), "ssim": _ssim(np.clip(rec, 0, 1), truth)}

    chosen, results = compare_arms(report, arm_list, s.lr_grid, train, val_mse, evaluate, s.seeds, seed,
                                   lambda a: {"steps": s.steps, "measurements": int(tr.sum()), "params": counts[a.name]},
                                   higher_is_better=False)
    report.check_budgets_matched(["steps", "measurements"])
    report.check_budgets_matched(["params"], rel_tol=0.05)
    fbp = np.clip(iradon(sino64, theta, filter_name="ramp", circle=True), 0.0, 1.0) * mask.double().numpy()
    fbp_psnr, fbp_ssim = psnr(torch.tensor(fbp), torch.tensor(truth)), _ssim(fbp, truth)

    lr_name, sr_name = (a.name for a in arm_list)
    report.measure_paired("lrnn_beats_siren_psnr", results[lr_name]["psnr"], results[sr_name]["psnr"])
    report.measure("lrnn_beats_fbp_psnr", [v - fbp_psnr for v in results[lr_name]["psnr"]])
    report.measure("lrnn_beats_fbp_ssim", [v - fbp_ssim for v in results[lr_name]["ssim"]])
    report.measure("no_run_diverged", diverged)
    t = report.table("Reconstruction quality against the phantom (means over seeds)",
                     ["method", "params", "lr", "psnr_db", "ssim", "per_seed_psnr"])
    for a in arm_list:
        r = results[a.name]
        t.add(method=a.name, params=counts[a.name], lr=chosen[a.name], psnr_db=st.fmean(r["psnr"]),
              ssim=st.fmean(r["ssim"]), per_seed_psnr=" ".join(f"{v:.2f}" for v in r["psnr"]))
    t.add(method="FBP (iradon, ramp)", params=0, lr="", psnr_db=fbp_psnr, ssim=fbp_ssim, per_seed_psnr="")
    report.note(f"Shepp-Logan at {s.n}x{s.n}, {s.angles} angles in [0, 180); INRs: LRNN ranks {list(s.ranks)}, "
                f"D = {s.proj_dim}, component width {s.hidden}, omega0 = 30; SIREN depth 3, omega0 = 30; {s.steps} "
                "full-batch Adam steps on 90% of the sinogram entries; images masked to the reconstruction circle; "
                "FBP clipped to [0, 1].")
    return report.finish()


__all__ = ["run", "SIZES", "Settings", "phantom"]
