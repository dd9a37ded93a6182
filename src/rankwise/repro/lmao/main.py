"""Reproduction of LMAO (Zhang et al., ICLR 2026) at CPU scale: MiniLM few-shot (k per class) wiki-topics.

Claims (declared before anything is measured):
- paper: LMAO beats first-order LoRA at equal steps (same LoRA phase, plus the ZO phase on the base weights);
- sanity: LMAO beats MeZO (full zeroth-order, its head fresh) by more than MEZO_MARGIN points (once a paper claim:
  issue 24 found it could not fail, MeZO near chance; the warm-head comparison is `lmao:digits`');
- invariant: LMAO's base update dW of every 2-D tensor has full numerical rank (rtol 1e-6);
- invariant: LMAO with eta_W = 0 trains exactly the LoRA trajectory (bit for bit, a short run);
- sanity: first-order LoRA learns the task (well above chance);
- paper: LMAO is within 2 points of full first-order fine-tuning (the card's "approaching full FT").

Protocol: every example is a wiki article's first `max_length` tokens; each seed draws its own k-shot training and
validation sample from the train split (the paper's few-shot protocol), the held-out articles come from the eval
split. Only the top `top_layers` encoder layers (and the head) are trained in every arm, the layers below being
cached: so LMAO's W here is every non-LoRA tensor of those layers (the top-layers variant; see the method page).
Each arm's rates are chosen on the tuning seed's validation sample: LoRA, MeZO and full FT on their own grids, a
choice on an edge extending the grid by a half-decade (up to `max_extend` times); LMAO by coordinates: eta_W on its
grid at LoRA's chosen eta_BA, then eta_BA over LoRA's choice and its half-decade neighbours at the chosen eta_W. The chosen rates then run on
fresh seeds (never the tuning seed), scored on the held-out split; paired differences over those seeds decide.
"""

from __future__ import annotations

import math
import os
import statistics as stats
from dataclasses import dataclass

from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.repro.lmao.arms import EPS, FULL_FT, HEAD_LR, LMAO, LORA, MEZO, Fit, Shape, fit, full_rank_fraction
from rankwise.repro.lmao.data import FewShotData
from rankwise.repro.lmao.tuning import add_summary, tune_arms
from rankwise.repro.setup import BySize, experiment_model


@dataclass(frozen=True)
class Settings:
    k: int  # examples per class, for training and (separately) for validation
    test: int  # held-out examples
    max_length: int
    shape: Shape
    seeds: int  # measurement seeds
    grids: tuple[tuple[str, tuple[float, ...]], ...]  # LoRA, MeZO, full FT: lr; LMAO: eta_W
    max_extend: int
    invariant_steps: int  # the eta_W = 0 bit-equality run

    def grid(self, arm: str) -> tuple[float, ...]:
        return dict(self.grids)[arm]


FULL_GRIDS = ((LORA, (3e-4, 1e-3, 3e-3, 1e-2)), (MEZO, (1e-5, 1e-4, 1e-3)), (FULL_FT, (3e-5, 1e-4, 3e-4)),
              (LMAO, (1e-5, 1e-4, 1e-3)))
SIZES = BySize(
    # full: sized from a timed probe to about 13 minutes at one thread on the shared 2-core machine
    full=Settings(k=16, test=600, max_length=32, shape=Shape(top_layers=2, rank=8, steps=120, batch=16), seeds=5,
                  grids=FULL_GRIDS, max_extend=1, invariant_steps=5),
    smoke=Settings(k=2, test=16, max_length=12, shape=Shape(top_layers=1, rank=2, steps=3, batch=4), seeds=2,
                   grids=tuple((a, g[:2]) for a, g in FULL_GRIDS), max_extend=0, invariant_steps=2),
)
MEZO_MARGIN = 5.0  # points: what ">>" means here, declared before the run
FT_MARGIN = -2.0


def _declare(report: Report, s: Settings) -> None:
    report.declare(PairedClaim("lmao-beats-lora", "per-seed held-out accuracy LMAO - first-order LoRA at equal steps "
                               "(points)", ">", 0.0, kind=ClaimKind.PAPER, n_min=3))
    # Issue 24: here MeZO must learn a fresh head by zeroth-order steps and stays near chance, so "LMAO >> MeZO"
    # could not fail; the paper claim against a warm MeZO is `lmao:digits`'. Kept as a check under a new id.
    report.declare(PairedClaim("lmao-beats-cold-head-mezo", f"per-seed held-out accuracy LMAO - MeZO at equal steps "
                               f"(points), MeZO learning its fresh head zeroth-order (near chance: a check, not evidence; "
                               f"the warm-head comparison is lmao:digits'); margin {MEZO_MARGIN:g} points", ">",
                               MEZO_MARGIN, kind=ClaimKind.SANITY, post_hoc=True))
    report.declare(Claim("base-update-full-rank", "min over LMAO's 2-D base tensors of numerical rank(W_T - W_0) / "
                         "min(m, n), rtol 1e-6 (first measurement seed)", ">=", 1.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("eta-w-zero-is-lora", f"max |LMAO(eta_W=0) - LoRA| over the trained tensors after "
                         f"{s.invariant_steps} steps (same seed)", "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(SampleClaim("lora-learns", "per-seed held-out accuracy of LoRA minus chance (1/12), points", ">", 20.0,
                               kind=ClaimKind.SANITY))
    report.declare(PairedClaim("lmao-near-full-ft", "per-seed held-out accuracy LMAO - full first-order fine-tuning "
                               f"(points); non-inferiority within {-FT_MARGIN:g} points (the card: 'approaching full FT')", ">=", FT_MARGIN,
                               kind=ClaimKind.PAPER))


def _score(f: Fit) -> float:
    """Validation accuracy; its loss breaks ties (accuracy moves in steps of 1/n). NaN: diverged."""
    return f.accuracy - 1e-6 * f.eval_loss if math.isfinite(f.accuracy) else float("nan")


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    sh = s.shape
    report = Report("lmao", "LMAO vs first-order LoRA, MeZO and full fine-tuning: MiniLM few-shot wiki-topics", size, seed)
    _declare(report, s)
    base, tokenizer = experiment_model("minilm-l6", size, seed)
    start = base.config.num_hidden_layers - sh.top_layers
    data = FewShotData(base, tokenizer, s.k, s.test, s.max_length, start)
    n = data.num_labels
    tune_task = data.tuning_task(seed)
    grid_table = report.table("Validation accuracy of every grid point (tuning seed)", ["arm", "lr", "eta_W", "validation accuracy",
                                                                                        "validation loss", "train s"])

    seen: dict[tuple[str, float, float], float] = {}  # LMAO's eta_BA pass revisits the eta_W pass's choice

    def validate(arm: str, lr: float, base_lr: float = 0.0) -> float:
        if (arm, lr, base_lr) in seen:
            return seen[arm, lr, base_lr]
        f = fit(arm, base, tune_task, sh, n, seed, lr, base_lr)
        seen[arm, lr, base_lr] = _score(f)
        say(f"lmao repro: {arm} lr {lr:g} eta_W {base_lr:g}: validation {f.accuracy:.3f} ({f.wall_s:.0f} s)")
        grid_table.add(arm=arm, lr=lr, eta_W=base_lr if arm == LMAO else "", **{"validation accuracy": f.accuracy,
                       "validation loss": f.eval_loss, "train s": f.wall_s})
        return _score(f)

    chosen = tune_arms(report, dict(s.grids), validate, s.max_extend, sh.steps, sh.batch)
    lora_lr = chosen[LORA][0]

    # invariant: eta_W = 0 is LoRA bit for bit (a short run at the tuning seed)
    a = fit(LORA, base, tune_task, sh, n, seed, lora_lr, steps=s.invariant_steps)
    b = fit(LMAO, base, tune_task, sh, n, seed, lora_lr, 0.0, steps=s.invariant_steps)
    report.measure("eta-w-zero-is-lora", max(float((a.state[k] - b.state[k]).abs().max()) for k in a.state))

    seeds = [seed + 1 + i for i in range(s.seeds)]
    per_seed = report.table("Held-out accuracy per seed (each arm at its chosen rates; a fresh k-shot sample per seed)",
                            ["arm", "lr", "eta_W", "seed", "accuracy", "eval loss", "FO trainable", "ZO params", "train s"])
    results: dict[str, list[float]] = {arm: [] for arm in (LORA, LMAO, MEZO, FULL_FT)}
    rank_fraction, rel_update = None, []
    for run_seed in seeds:
        task = data.final_task(run_seed)
        for arm in results:
            lr, w = chosen[arm]
            f = fit(arm, base, task, sh, n, run_seed, lr, w)
            results[arm].append(100 * f.accuracy)
            per_seed.add(arm=arm, lr=lr, eta_W=w if arm == LMAO else "", seed=run_seed, accuracy=f.accuracy,
                         **{"eval loss": f.eval_loss, "FO trainable": 0 if arm == MEZO else f.trainable,
                            "ZO params": f.zo_params, "train s": f.wall_s})
            if arm == LMAO and f.base_delta:
                if rank_fraction is None:
                    rank_fraction = full_rank_fraction(f.base_delta)
                rel_update.append(math.sqrt(sum(float(d.square().sum()) for d in f.base_delta.values())))
    add_summary(report, "Mean held-out accuracy over seeds (points)", results, chosen)
    report.measure_paired("lmao-beats-lora", results[LMAO], results[LORA])
    report.measure_paired("lmao-beats-cold-head-mezo", results[LMAO], results[MEZO])
    report.measure("base-update-full-rank", rank_fraction)
    report.measure("lora-learns", [v - 100 / n for v in results[LORA]])
    report.measure_paired("lmao-near-full-ft", results[LMAO], results[FULL_FT])
    report.plots["lmao_accuracy"] = _plot(results)
    report.note(f"MiniLM-L6 (all-MiniLM-L6-v2), 12-class wiki-topics, k = {s.k} training and k validation articles per "
                f"class per seed, {s.test} held-out eval-split articles, first {s.max_length} tokens. The top {sh.top_layers} "
                f"encoder layers are trained (layers below cached); mean pooling + linear head (trained first-order at lr "
                f"{HEAD_LR:g} in LoRA, LMAO and full FT; by ZO in MeZO). LoRA r={sh.rank}, alpha={2 * sh.rank} on query and "
                f"value. {sh.steps} steps of batch {sh.batch} for every arm; warmup 10% + cosine for the first-order rates, "
                f"constant ZO rates (the reference code's), eps = {EPS:g}, no weight decay. LMAO's W: every non-LoRA tensor "
                f"of the top layers (weights, biases, LayerNorms); MeZO's: those and the head. Tuning at seed {seed}, "
                f"measurement at seeds {seeds}. Mean Frobenius norm of LMAO's total base update: "
                f"{stats.mean(rel_update) if rel_update else float('nan'):.4g}.")
    if hasattr(os, "getloadavg"):
        report.note(f"1-minute load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} logical cores (above the "
                    "core count, other jobs shared the CPU and the wall time overstates an idle machine's).")
    return report.finish()


def _plot(results: dict[str, list[float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    names = list(results)
    ax.bar(range(len(names)), [stats.mean(results[k]) for k in names], color="#8fb3d9")
    for i, k in enumerate(names):
        ax.plot([i] * len(results[k]), results[k], "k.", ms=6)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title("MiniLM few-shot wiki-topics, each arm at its chosen rates")
    fig.tight_layout()
    return fig
