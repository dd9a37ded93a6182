"""B. Real weights in the report: MiniLM and SmolLM2 at every operating point (SQNR, the error's three terms, the
scale census), torchao parity and the per-tensor error model; the sweep itself is `weights.py`."""

from __future__ import annotations

from rankwise.core.layer_names import layer_index
from rankwise.core.report import Report
from rankwise.quant.block import get_recipe
from rankwise.quant.error_model import predict_tensor
from rankwise.quant.fake_quant import quantizable_linears
from rankwise.repro.microscaling_ue5m3 import parity
from rankwise.repro.microscaling_ue5m3.plan import MODEL_SCALES, REGIMES, SCALES, Settings
from rankwise.repro.microscaling_ue5m3.regimes import regime_alphas
from rankwise.repro.microscaling_ue5m3.weights import sweep, ue5m3_changed_blocks


def minilm_weights(report: Report, plan: Settings, weights) -> int:
    """MiniLM at every point; returns the UE5M3 invariance count (changed blocks), pooled with SmolLM2's later."""
    res = sweep(weights, REGIMES, SCALES, plan.weight_ks, census_for=("UE4M3",))
    _sqnr_table(report, "MiniLM", weights, res, plan.weight_ks)
    _terms_table(report, "MiniLM", res, plan.weight_ks)
    mse = lambda r, s, k: res[r, s, k].error.mse  # noqa: E731
    ratio = lambda r, s: mse(r, s, 8) / mse(r, s, 16)  # noqa: E731

    def unflushed_ratio(r: str) -> float:
        t8, t16 = res[r, "UE4M3", 8].terms, res[r, "UE4M3", 16].terms
        return (t8.element + t8.max_element) / (t16.element + t16.max_element)

    report.measure("minilm-anomaly-ue4m3", ratio("subnormal", "UE4M3"))
    report.get_claim("minilm-anomaly-ue4m3").measure_control(ratio("normal", "UE4M3"))
    report.measure("minilm-no-anomaly-ue5m3", ratio("subnormal", "UE5M3"))
    report.get_claim("minilm-no-anomaly-ue5m3").measure_control(ratio("subnormal", "UE4M3"))
    report.measure("minilm-anomaly-without-flushing", unflushed_ratio("subnormal"))
    report.get_claim("minilm-anomaly-without-flushing").measure_control(unflushed_ratio("normal"))
    cen = {k: res["subnormal", "UE4M3", k].census for k in (8, 16)}
    report.measure("minilm-subnormal-point-placed", min(c.subnormal for c in cen.values()))
    report.measure("minilm-subnormal-point-few-flushed", max(c.flushed for c in cen.values()))
    report.measure("minilm-flush-point-placed", min(res["flush", "UE4M3", k].census.flushed for k in (8, 16)))
    base = mse("as-is", "UE4M3-S", 8)
    report.measure("ue4m3-s-unchanged-across-points",
                   max(abs(mse(r, "UE4M3-S", 8) - base) / base for r in REGIMES))
    report.plots["minilm_sqnr_vs_block"] = _plot_sqnr(plan, res, "MiniLM")
    return sum(ue5m3_changed_blocks(weights, r, 8)[0] for r in REGIMES[1:])


def smollm2_weights(report: Report, plan: Settings, weights, changed: int) -> None:
    res = sweep(weights, ("as-is", "subnormal", "saturate"), {s: SCALES[s] for s in MODEL_SCALES}, (8, 16),
                census_for=("UE4M3", "UE5M3"))
    _sqnr_table(report, "SmolLM2", weights, res, (8, 16))
    report.measure("smollm2-subnormal-point-placed", min(res["subnormal", "UE4M3", k].census.subnormal for k in (8, 16)))
    no_ue5 = all(res["saturate", "UE5M3", k].census.saturated == 0 for k in (8, 16))
    report.measure("smollm2-saturate-point-placed",
                   min(res["saturate", "UE4M3", k].census.saturated for k in (8, 16)) if no_ue5 else 0.0)
    changed += sum(ue5m3_changed_blocks(weights, r, 8)[0] for r in ("normal", "subnormal", "flush", "saturate"))
    report.measure("ue5m3-unchanged-across-points", changed)


def torchao_parity(report: Report, weights) -> None:
    if not parity.available():
        report.note("torchao is not installed: the torchao parity invariants are not measured (INCONCLUSIVE).")
        return
    total: dict[str, list[int]] = {}
    for regime in ("as-is", "subnormal"):
        for name, (bad, n) in parity.parity_mismatches(weights, regime_alphas(weights, regime)).items():
            acc = total.setdefault(name, [0, 0])
            acc[0], acc[1] = acc[0] + bad, acc[1] + n
    for name, (bad, n) in total.items():
        report.measure(f"torchao-parity-{name}", bad)
    report.note("torchao parity compared " + ", ".join(f"{n} {name} blocks" for name, (_, n) in total.items())
                + " (MiniLM + the SmolLM2 layers of section B, at alpha = 1 and at the subnormal point).")


def _sqnr_table(report: Report, label: str, weights, res: dict, ks) -> None:
    regimes = sorted({r for r, _, _ in res}, key=REGIMES.index)
    scales = list(dict.fromkeys(s for _, s, _ in res))
    table = report.table(f"B. {label} weights: SQNR (dB) vs block size at each operating point ({len(weights)} "
                         f"tensors, {sum(w.numel() for _, w in weights) / 1e6:.1f}M weights)",
                         ["point", "scale", *[f"SQNR k={k}" for k in ks], "UE4M3 scales: subnormal / flushed / "
                          f"saturated share at k={min(ks)}"])
    for r in regimes:
        for s in scales:
            c = res[r, s, min(ks)].census
            table.add(point=r, scale=s, **{f"SQNR k={k}": res[r, s, k].error.sqnr_db for k in ks}, **{
                table.columns[-1]: "" if c is None else f"{c.subnormal:.4f} / {c.flushed:.4f} / {c.saturated:.4f}"})


def _terms_table(report: Report, label: str, res: dict, ks) -> None:
    table = report.table(f"B. {label} weights: the error's three terms (per element, W's units) and block 8 / block 16",
                         ["point", "scale", "k", "ordinary", "block max", "flushed", "total"])
    for r in REGIMES:
        for s in ("UE4M3", "UE5M3"):
            for k in (8, 16):
                t = res[r, s, k].terms
                table.add(point=r, scale=s, k=k, ordinary=t.element, **{"block max": t.max_element},
                          flushed=t.zero_block, total=t.total)


def error_model_table(report: Report, plan: Settings, bert) -> None:
    tensors = [(n, m.weight.detach()) for n, m in quantizable_linears(bert, ("pooler.dense",))
               if layer_index(n) in plan.error_model_layers]
    table = report.table("B. error model per tensor vs measured (MiniLM weights; MSE summed over the tensors)",
                         ["point", "scale", "k", "measured MSE", "predicted MSE", "predicted/measured",
                          "per-tensor ratio min", "per-tensor ratio max", "measured zero-block share"])
    for regime in ("as-is", "subnormal", "flush"):
        alphas = regime_alphas(tensors, regime)
        for scale in MODEL_SCALES:
            for k in plan.error_model_ks:
                preds = [(predict_tensor(w * alphas[n], get_recipe(SCALES[scale], k), sigma_points=8, points=1500),
                          alphas[n]) for n, w in tensors]
                meas = sum(p.measured.total / a**2 for p, a in preds)
                pred = sum(p.predicted.total / a**2 for p, a in preds)
                ratios = [p.ratio for p, _ in preds]
                table.add(point=regime, scale=scale, k=k, **{
                    "measured MSE": meas, "predicted MSE": pred, "predicted/measured": pred / meas,
                    "per-tensor ratio min": min(ratios), "per-tensor ratio max": max(ratios),
                    "measured zero-block share": sum(p.measured.zero_block / a**2 for p, a in preds) / meas})


def _plot_sqnr(plan: Settings, res: dict, label: str):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(REGIMES), figsize=(4 * len(REGIMES), 3.6), squeeze=False)
    for ax, regime in zip(axes[0], REGIMES):
        for scale in SCALES:
            ax.plot(plan.weight_ks, [res[regime, scale, k].error.sqnr_db for k in plan.weight_ks], "o-", label=scale)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{label} weights, {regime} point")
        ax.set_xlabel("block size")
        ax.set_ylabel("SQNR (dB)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig
