"""Reproduction of CARE (one-shot GQA -> MLA): covariance-aware factorization and adjusted ranks beat plain SVD.

Setup (full): SmolLM2-135M-Instruct (the Q4_1 GGUF dequantized to fp32, so "original" is a 4-bit model), KV width
192 per matrix, ranks r in {12, 24, 48, 96} per matrix (93.75 / 87.5 / 75 / 50 % KV saving). Calibration: 256
windows of 32 tokens from the wiki calibration split (CARE's "256 x 32"), one draw per calibration seed.
Evaluation: perplexity on held-out windows of the eval split (disjoint articles); next-sentence multiple choice
on held-out eval-split articles (`rankwise.eval.multiple_choice`, an accuracy beside perplexity); per-layer relative
activation error ||X (W - W_hat)|| / ||X W|| on held-out eval-split activations, by the trace identity. Every
method is compared at the same KV-cache size. The first calibration seed runs every method at every rank; the
others rerun the calibrated arms the claims pair (CARE-U, CARE-E, SVD-LLM; plain SVD needs no calibration).

The claims' baseline is SVD-LLM, the strongest calibrated factorization here and the one that shares CARE's objective
(the activation-weighted error): plain SVD is broken at every rank on this model (perplexity x1,500-2,800), so "CARE
below plain SVD" could not fail; those comparisons are kept as sanity checks of the set-up.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rankwise.compress.mla.calibration import calibration_windows, kv_input_moments
from rankwise.compress.mla.convert import apply_plan, decompose_kv
from rankwise.compress.mla.layout import kv_layout
from rankwise.compress.mla.metrics import activation_errors
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.data import articles, token_windows
from rankwise.eval import perplexity
from rankwise.eval.multiple_choice import choice_accuracy, next_sentence_items
from rankwise.repro.setup import BySize, experiment_model

TITLE = "CARE: Covariance-Aware and Rank-Enhanced Decomposition for Enabling Multi-Head Latent Attention"


@dataclass(frozen=True)
class Variant:
    label: str
    method: str
    allocation: str = "uniform"
    score: str = "paper"


VARIANTS = (
    Variant("Palu (SVD)", "svd"),
    Variant("ASVD", "asvd"),
    Variant("SVD-LLM", "svd-llm"),
    Variant("MHA2MLA (joint SVD)", "mha2mla"),
    Variant("CARE-U", "care"),
    Variant("CARE-E (paper score)", "care", "adjusted", "paper"),
    Variant("CARE-E (code score)", "care", "adjusted", "code"),
)
SVD, SVD_LLM = VARIANTS[0].label, VARIANTS[2].label
CARE_U, CARE_E, CARE_E_CODE = VARIANTS[4].label, VARIANTS[5].label, VARIANTS[6].label
CALIBRATED_CLAIM_ARMS = (SVD_LLM, CARE_U, CARE_E)  # rerun on every calibration seed


@dataclass(frozen=True)
class Settings:
    ranks: tuple[int, ...]
    calib_samples: int
    calib_seq_len: int
    eval_windows: int
    eval_seq_len: int
    heldout_windows: int  # eval windows whose activations measure the held-out activation error
    timed_rank: int  # the conversion timed end to end (calibration + factorization), CARE-E at this rank
    seeds: int  # calibration seeds (different calibration windows)
    high_saving_ranks: tuple[int, ...]  # where the paper claims adjusted ranks gain: 87.5 % saving and above
    mc_rank: int  # the rank the multiple-choice accuracy is measured at
    mc_items: int
    mc_choices: int


SIZES = BySize(
    full=Settings(ranks=(12, 24, 48, 96), calib_samples=256, calib_seq_len=32, eval_windows=8, eval_seq_len=256, heldout_windows=4,
                  timed_rank=48, seeds=5, high_saving_ranks=(12, 24), mc_rank=24, mc_items=48, mc_choices=4),
    smoke=Settings(ranks=(4, 8, 16), calib_samples=16, calib_seq_len=16, eval_windows=2, eval_seq_len=64, heldout_windows=2,
                   timed_rank=8, seeds=3, high_saving_ranks=(4,), mc_rank=4, mc_items=4, mc_choices=3),
)
MC_CONTEXT_TOKENS, MC_CHOICE_TOKENS = 32, 16


def _declare(report: Report, setting: Settings) -> None:
    """Every claim, before anything is measured. The first reports' claims against plain SVD are retired (their
    verdicts stay in the history): the same comparisons are sanity checks here, the paper claims pair SVD-LLM."""
    n = setting.seeds
    new = dict(post_hoc=True, testbed=f"SmolLM2 one-shot, ranks {list(setting.ranks)}, {n} calibration seeds, SVD-LLM "
                                      "on every seed")
    paper = dict(kind=ClaimKind.PAPER, **new)
    for label, key in ((CARE_U, "care_u"), (CARE_E, "care_e")):
        report.declare(PairedClaim(
            f"{key}_ppl_below_svd_llm", f"{label} beats SVD-LLM at equal KV-cache size: mean over r in "
            f"{list(setting.ranks)} of log PPL({label}) - log PPL(SVD-LLM), paired over {n} calibration seeds", "<", 0.0,
            **paper))
    for r in setting.high_saving_ranks:
        report.declare(PairedClaim(
            f"care_e_ppl_below_svd_llm_r{r}", f"at r={r} ({_saving(r)} KV saving, where the paper claims its gain): log "
            f"PPL(CARE-E) - log PPL(SVD-LLM), paired over {n} calibration seeds", "<", 0.0, **paper))
    for r in setting.high_saving_ranks:
        report.declare(PairedClaim(
            f"care_e_beats_care_u_r{r}", f"adjusted ranks beat uniform at r={r} ({_saving(r)} KV saving, where the paper claims the gain): "
            f"log PPL(CARE-E) - log PPL(CARE-U), paired over {n} calibration seeds", "<", 0.0, kind=ClaimKind.PAPER))
    r = setting.mc_rank
    report.declare(PairedClaim(
        f"care_u_accuracy_above_svd_llm_r{r}", f"next-sentence multiple-choice accuracy (points) at r={r}: CARE-U - SVD-LLM, "
        f"paired over {n} calibration seeds", ">", 0.0, **paper))
    report.declare(PairedClaim(
        f"care_e_accuracy_above_care_u_r{r}", f"next-sentence multiple-choice accuracy (points) at r={r}: CARE-E - CARE-U, paired over {n} calibration seeds",
        ">", 0.0, kind=ClaimKind.PAPER))
    sanity = dict(kind=ClaimKind.SANITY, **new)
    report.declare(SampleClaim(
        "care_u_far_below_plain_svd", "the set-up: plain SVD is the broken reference -- per calibration seed, max over r of "
        "PPL(CARE-U) / PPL(plain SVD)", "<", 1.0, **sanity))
    report.declare(SampleClaim(
        "care_activation_error_le_plain_svd", "CARE-U's held-out activation error is at most plain SVD's in every layer, "
        "for K and V, at every r: per calibration seed, the max ratio", "<=", 1.0, **sanity))
    report.declare(Claim(
        "original_accuracy_above_chance", f"the original model's multiple-choice accuracy minus chance (1/{setting.mc_choices}), points: "
        "the measure can see a working model", ">", 10.0, kind=ClaimKind.SANITY))


def _saving(r: int, kv_width: int = 192) -> str:
    return f"{100 * (1 - r / kv_width):.2f} %"


def run(size: str = "smoke", seed: int = 0) -> Report:
    set_seed(seed)
    report = Report("care-mla", TITLE, size, seed)
    setting = SIZES[size]
    _declare(report, setting)
    model, tokenizer = experiment_model("smollm2-135m", size, seed, num_layers=3)
    layout = kv_layout(model)
    seeds = [seed + i for i in range(setting.seeds)]

    eval_windows = token_windows(tokenizer, "eval", setting.eval_seq_len, setting.eval_windows)
    heldout = kv_input_moments(model, eval_windows[: setting.heldout_windows], use_cache=False)
    original_ppl = perplexity(model, eval_windows, desc="perplexity (original)").perplexity
    items = next_sentence_items([a.text for a in articles("eval")], setting.mc_items, setting.mc_choices, seed=0)
    accuracy = lambda m, label: 100 * choice_accuracy(m, tokenizer, items, MC_CONTEXT_TOKENS, MC_CHOICE_TOKENS, desc=f"multiple choice ({label})").accuracy  # noqa: E731
    original_acc = accuracy(model, "original")
    say(f"care-mla: original perplexity {original_ppl:.2f}, multiple-choice accuracy {original_acc:.1f} %")

    ppl_table = report.table(
        "Held-out perplexity at equal KV-cache size (first calibration seed)",
        ["r", "kv_saving", "method", "allocation", "perplexity", "x original", "act_err_K", "act_err_V", "act_err_max"],
    )
    ppl: dict[tuple[str, int, int], float] = {}  # (label, r, calibration seed)
    acc: dict[tuple[str, int], float] = {}  # (label, calibration seed) at mc_rank
    errors: dict[tuple[str, int, int], list] = {}
    profiles: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    timing: dict[str, float] = {}
    for s in seeds:
        first = s == seeds[0]
        calibration = calibration_windows(token_windows(tokenizer, "calibration", setting.calib_seq_len), setting.calib_samples, s)
        t0 = time.perf_counter()
        moments = kv_input_moments(model, calibration, use_cache=False)
        if first:
            timing["calibration"] = time.perf_counter() - t0
        # the first seed runs every method; later seeds the calibrated arms the claims need (SVD is calibration-free)
        variants = VARIANTS if first else tuple(v for v in VARIANTS if v.label in CALIBRATED_CLAIM_ARMS)
        for method in dict.fromkeys(v.method for v in variants):
            t0 = time.perf_counter()
            decomposition = decompose_kv(model, method, moments)
            if first:
                timing[f"decompose {method}"] = time.perf_counter() - t0
            for r in setting.ranks:
                for v in (v for v in variants if v.method == method):
                    t0 = time.perf_counter()
                    plan = decomposition.plan(r, v.allocation, v.score)
                    converted = apply_plan(model, plan)
                    if first and v.label == CARE_E and r == setting.timed_rank:
                        timing["allocate + install CARE-E"] = time.perf_counter() - t0
                    errs = activation_errors(model, plan, heldout)
                    result = perplexity(converted, eval_windows, desc=f"perplexity ({v.label}, r={r}, seed {s})").perplexity
                    if r == setting.mc_rank and v.label in (SVD, *CALIBRATED_CLAIM_ARMS):
                        acc[v.label, s] = accuracy(converted, f"{v.label}, r={r}, seed {s}")
                    del converted
                    ppl[v.label, r, s], errors[v.label, r, s] = result, errs
                    if first:
                        profiles[v.label, r] = (plan.k_ranks, plan.v_ranks)
                        k_mean = sum(e.k for e in errs) / len(errs)
                        v_mean = sum(e.v for e in errs) / len(errs)
                        ppl_table.add(r=r, kv_saving=round(1 - r / layout.kv_width, 4), method=v.label, allocation=_allocation_name(v),
                                      perplexity=result, **{"x original": result / original_ppl}, act_err_K=k_mean, act_err_V=v_mean,
                                      act_err_max=max(max(e.k, e.v) for e in errs))
                    say(f"  seed {s} r={r:3d} {v.label:22s} perplexity {result:10.2f}")
        if not first:  # the calibration-free SVD arm is the same model for every seed
            for r in setting.ranks:
                ppl[SVD, r, s], errors[SVD, r, s] = ppl[SVD, r, seeds[0]], errors[SVD, r, seeds[0]]
            acc[SVD, s] = acc[SVD, seeds[0]]

    _claims(report, setting, seeds, ppl, acc, errors, original_acc)
    _seed_tables(report, setting, seeds, ppl, acc, original_ppl, original_acc)
    first_errors = {(label, r): errors[label, r, seeds[0]] for label, r, s in errors if s == seeds[0]}
    first_ppl = {(label, r): ppl[label, r, seeds[0]] for label, r, s in ppl if s == seeds[0]}
    _layer_table(report, setting, first_errors, profiles)
    _timing_table(report, timing, setting)
    report.plots["perplexity_vs_kv_saving"] = _plot_perplexity(setting, layout.kv_width, first_ppl, original_ppl)
    report.plots["rank_profile"] = _plot_profile(setting, profiles)
    report.plots["activation_error_per_layer"] = _plot_errors(setting, first_errors)
    _notes(report, setting, original_ppl, original_acc)
    return report.finish()


def _allocation_name(v: Variant) -> str:
    return v.allocation if v.allocation == "uniform" else f"adjusted ({v.score})"


def _claims(report: Report, setting: Settings, seeds: list[int], ppl: dict, acc: dict, errors: dict, original_acc: float) -> None:
    ranks = setting.ranks
    mean_log = lambda label, s: sum(math.log(ppl[label, r, s]) for r in ranks) / len(ranks)  # noqa: E731
    for label, key in ((CARE_U, "care_u"), (CARE_E, "care_e")):
        report.measure_paired(f"{key}_ppl_below_svd_llm", [mean_log(label, s) for s in seeds], [mean_log(SVD_LLM, s) for s in seeds])
    log_at = lambda label, r: [math.log(ppl[label, r, s]) for s in seeds]  # noqa: E731
    for r in setting.high_saving_ranks:
        report.measure_paired(f"care_e_ppl_below_svd_llm_r{r}", log_at(CARE_E, r), log_at(SVD_LLM, r))
        report.measure_paired(f"care_e_beats_care_u_r{r}", log_at(CARE_E, r), log_at(CARE_U, r))
    r = setting.mc_rank
    report.measure_paired(f"care_u_accuracy_above_svd_llm_r{r}", [acc[CARE_U, s] for s in seeds], [acc[SVD_LLM, s] for s in seeds])
    report.measure_paired(f"care_e_accuracy_above_care_u_r{r}", [acc[CARE_E, s] for s in seeds], [acc[CARE_U, s] for s in seeds])
    report.measure("care_u_far_below_plain_svd", [max(ppl[CARE_U, r, s] / ppl[SVD, r, s] for r in ranks) for s in seeds])
    report.measure("care_activation_error_le_plain_svd", [
        max(max(c.k / b.k, c.v / b.v) for r in ranks for c, b in zip(errors[CARE_U, r, s], errors[SVD, r, s])) for s in seeds])
    report.measure("original_accuracy_above_chance", original_acc - 100.0 / setting.mc_choices)


def _seed_tables(report: Report, setting: Settings, seeds: list[int], ppl: dict, acc: dict, original_ppl: float, original_acc: float) -> None:
    table = report.table("CARE-U, CARE-E and SVD-LLM per calibration seed (perplexity)",
                         ["seed", "r", "kv_saving", "SVD-LLM", "CARE-U", "CARE-E", "U / SVD-LLM", "E / SVD-LLM", "E / U", "plain SVD"])
    for s in seeds:
        for r in setting.ranks:
            table.add(seed=s, r=r, kv_saving=round(1 - r / 192, 4), **{
                "SVD-LLM": ppl[SVD_LLM, r, s], "CARE-U": ppl[CARE_U, r, s], "CARE-E": ppl[CARE_E, r, s],
                "U / SVD-LLM": ppl[CARE_U, r, s] / ppl[SVD_LLM, r, s], "E / SVD-LLM": ppl[CARE_E, r, s] / ppl[SVD_LLM, r, s],
                "E / U": ppl[CARE_E, r, s] / ppl[CARE_U, r, s], "plain SVD": ppl[SVD, r, s]})
    r = setting.mc_rank
    table = report.table(f"Next-sentence multiple-choice accuracy (%) at r = {r}, {setting.mc_items} items x {setting.mc_choices} choices",
                         ["seed", "original", "plain SVD", "SVD-LLM", "CARE-U", "CARE-E"])
    for s in seeds:
        table.add(seed=s, original=original_acc, **{"plain SVD": acc[SVD, s], "SVD-LLM": acc[SVD_LLM, s], "CARE-U": acc[CARE_U, s],
                                                    "CARE-E": acc[CARE_E, s]})


def _layer_table(report: Report, setting: Settings, errors: dict, profiles: dict) -> None:
    r = setting.timed_rank
    table = report.table(
        f"Per-layer held-out activation error and CARE-E ranks at r = {r}",
        ["layer", "svd_K", "care_u_K", "svd_V", "care_u_V", "care_e_K_rank", "care_e_V_rank", "code_K_rank", "code_V_rank"],
    )
    for i, (s, c) in enumerate(zip(errors[SVD, r], errors[CARE_U, r])):
        table.add(layer=i, svd_K=s.k, care_u_K=c.k, svd_V=s.v, care_u_V=c.v,
                  care_e_K_rank=profiles[CARE_E, r][0][i], care_e_V_rank=profiles[CARE_E, r][1][i],
                  code_K_rank=profiles[CARE_E_CODE, r][0][i], code_V_rank=profiles[CARE_E_CODE, r][1][i])


def _timing_table(report: Report, timing: dict, setting: Settings) -> None:
    care_total = timing["calibration"] + timing["decompose care"] + timing["allocate + install CARE-E"]
    table = report.table("Conversion time (s, this machine; evaluation excluded)", ["step", "seconds"])
    for step, seconds in timing.items():
        table.add(step=step, seconds=round(seconds, 2))
    table.add(step=f"CARE-E conversion at r={setting.timed_rank}, end to end (target < 60 s)", seconds=round(care_total, 2))


def _plot_perplexity(setting: Settings, kv_width: int, ppl: dict, original: float):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    savings = [100 * (1 - r / kv_width) for r in setting.ranks]
    for v in VARIANTS:
        ax.plot(savings, [ppl[v.label, r] for r in setting.ranks], marker="o", label=v.label)
    ax.axhline(original, color="black", linestyle="--", linewidth=1, label="original")
    ax.set_yscale("log")
    ax.set_xlabel("KV-cache saving (%)")
    ax.set_ylabel("held-out perplexity (log)")
    ax.set_title("One-shot GQA -> MLA: perplexity at equal cache size")
    ax.legend(fontsize=8)
    return fig


def _plot_profile(setting: Settings, profiles: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(setting.ranks), figsize=(4 * len(setting.ranks), 3.5), sharey=False)
    for ax, r in zip(axes, setting.ranks):
        for label, style in ((CARE_E, "-"), (CARE_E_CODE, ":")):
            k, v = profiles[label, r]
            ax.plot(k, style, marker=".", label=f"{label} K")
            ax.plot(v, style, marker="x", label=f"{label} V")
        ax.axhline(r, color="gray", linewidth=1)
        ax.set_title(f"mean rank {r}")
        ax.set_xlabel("layer")
    axes[0].set_ylabel("rank")
    axes[0].legend(fontsize=7)
    fig.suptitle("Adjusted (water-filling) rank profile across layers")
    return fig


def _plot_errors(setting: Settings, errors: dict):
    import matplotlib.pyplot as plt

    r = setting.timed_rank
    fig, ax = plt.subplots(figsize=(7, 4))
    for label in (SVD, "ASVD", "SVD-LLM", CARE_U):
        ax.plot([e.k for e in errors[label, r]], marker=".", label=f"{label} K")
    ax.plot([e.v for e in errors[SVD, r]], "--", label=f"{SVD} V")
    ax.plot([e.v for e in errors[CARE_U, r]], "--", label=f"{CARE_U} V")
    ax.set_xlabel("layer")
    ax.set_ylabel("relative activation error (held-out)")
    ax.set_title(f"Per-layer activation error at r = {r}")
    ax.legend(fontsize=8)
    return fig


def _notes(report: Report, setting: Settings, original_ppl: float, original_acc: float) -> None:
    report.note(
        f"Original model perplexity {original_ppl:.3f} on {setting.eval_windows} eval windows of {setting.eval_seq_len} tokens; "
        f"calibration {setting.calib_samples} x {setting.calib_seq_len} tokens per calibration seed ({setting.seeds} seeds, each a "
        f"different draw of calibration windows); held-out activation errors from {setting.heldout_windows} eval windows. "
        "The 'original' SmolLM2 is the Q4_1 GGUF dequantized to fp32."
    )
    report.note(
        f"Multiple choice (`rankwise.eval.multiple_choice`): {setting.mc_items} items from eval-split articles (deterministic, seed 0), "
        f"each a context sentence and {setting.mc_choices} candidates: its true next sentence and sentences from other articles; "
        f"the pick is the highest mean log-likelihood per candidate token (context cut to its last {MC_CONTEXT_TOKENS} tokens, "
        f"candidates to their first {MC_CHOICE_TOKENS}). The original scores {original_acc:.1f} % (chance {100 / setting.mc_choices:.0f} %). "
        "The items are fixed, so the seed intervals carry the calibration's variation, not the item sample's "
        f"(one item is {100 / setting.mc_items:.1f} points)."
    )
    report.note(
        "Adjusted vs uniform is tested where the paper's Table 1 claims the gain (87.5 % saving and above: Llama r=128, Qwen r=128; "
        "at 93.75 % its perplexities tie and the gain is in accuracy); at 75 % and 50 % the paper's own adjusted ranks lose on perplexity, "
        "so the earlier claim 'E <= U at r in {24, 48}' was stricter than the paper and is replaced (see the history)."
    )
    report.note(
        "One-shot form (the paper's Table 1): k_proj/v_proj become down (D x r) and up (r x kv_width) factors and RoPE is "
        "applied after the up-projection, so the KV saving is that of a latent cache; the deployable decoupled-RoPE cache is the deploy experiment."
    )
    report.note(
        "MHA2MLA (joint SVD) gets one shared latent of width 2r per layer, the same cache as r_K + r_V = 2r. "
        "Damping: CARE 0.1 x mean(diag C) (the authors' code), SVD-LLM 0.01; with equal damping SVD-LLM and CARE-U coincide "
        "(same objective). ASVD scales columns by rms(x)^0.5 (the second-moment pipeline's statistic) rather than mean|x|^0.5."
    )
    report.note(
        "Adjusted allocation: budget L x r per matrix kind (K and V separately), bounds [r/2, min(2r, 192)], ties to the lowest layer."
    )
    report.note("Wall time is on a 2-core CPU shared with other jobs, 1 thread; the timing table is indicative, not a benchmark.")
