"""Reproduction `lora-pre`: low-rank optimizer states (LoRA-Pre) vs AdamW and GaLore.

(A) Tracking: on a synthetic gradient stream whose low-rank subspace drifts, LoRA-Pre's rank-r momentum factors stay
    close to the best rank-r approximation of the exact EMA, while GaLore's periodically refreshed projection lags.
(B) Pretraining: a small Llama (SmolLM2 tokenizer and architecture, tied embeddings, random init) trained from
    scratch on the wiki train split with AdamW, GaLore at rank r, and LoRA-Pre at ranks r and r/8, at the same
    token budget, batches and schedule (the training harness, `rankwise.training.train`, on a language-modelling
    task over the token windows). Each optimizer gets the same small learning-rate sweep; the learning rate
    is chosen on the calibration split and the held-out loss is reported on the eval split.
(C) Fine-tuning (`lora_pre_finetune`): LoRA-Pre full fine-tuning of MiniLM vs AdamW and vs a LoRA adapter of the
    same rank, on the adapter harness's wiki-topics task.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.core.evidence import ClaimKind
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.data import token_windows
from rankwise.eval.perplexity import perplexity
from rankwise.models import load_smollm2_tokenizer, tiny_llama
from rankwise.optim import optimizer_state_bytes, split_low_rank_params
from rankwise.repro.lora_pre.finetune import declare_finetune_claims, finetune_experiment
from rankwise.repro.lora_pre.tracking import TrackingResult, track_drifting_momentum
from rankwise.repro.setup import BySize
from rankwise.training import LanguageModelingTask, TrainConfig, TrainResult, train
from rankwise.training.optimizers import OptimizerFactory, adamw, galore, lora_pre

TITLE = "Taming Momentum: Rethinking Optimizer States Through Low-Rank Approximation"


@dataclass(frozen=True)
class Settings:
    # (A) tracking
    track_dim: int
    track_true_rank: int
    track_steps: int
    track_refresh: int
    # (B) pretraining
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    seq_len: int
    batch: int
    steps: int
    rank: int  # r; LoRA-Pre also runs at r // 8
    lrs: tuple[float, ...]  # the sweep every optimizer gets
    eval_windows: int
    val_windows: int
    eval_every: int
    train_split: str = "train"


SIZES = BySize(
    # smoke trains on the small calibration split (plumbing only; tokenizing the train split takes seconds)
    smoke=Settings(32, 4, 100, 25, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, seq_len=32, batch=2,
                   steps=3, rank=8, lrs=(3e-3,), eval_windows=2, val_windows=2, eval_every=2, train_split="calibration"),
    full=Settings(256, 8, 2000, 200, hidden=160, layers=4, heads=5, kv_heads=5, intermediate=432, seq_len=128,
                  batch=8, steps=60, rank=32, lrs=(3e-3, 1e-2), eval_windows=48, val_windows=24, eval_every=20),
)
GALORE_SCALE = 0.25  # GaLore's default scale for LLaMA pretraining
GALORE_REFRESHES = 6  # projector refreshes per run (the card: gap 200 over 1200 steps)
WARMUP_RATIO, MIN_LR_RATIO, CLIP_NORM = 0.1, 0.1, 1.0  # warmup 10%, cosine to 10% of the peak, clipping at norm 1


def run(size: str = "smoke", seed: int = 0) -> Report:
    """Run both experiments at `size` ('smoke': seconds; 'full': minutes on 2 CPU cores) and return the report."""
    report = Report(slug="lora-pre", title=TITLE, size=size, seed=seed)
    setup = SIZES[size]
    declare_finetune_claims(report, size)
    set_seed(seed)
    runs = _pretraining_experiment(report, setup, seed)
    tracking = _tracking_experiment(report, setup, seed)
    report.plots["tracking_error"] = _tracking_plot(tracking)
    report.plots["loss_curves"] = _loss_plot(runs)
    finetune_experiment(report, size, seed)
    report.note(
        "Update-order reading: factors updated m_B first, then m_A with the new m_B (Gauss-Seidel); the step's moments "
        "use the factors from before this step's regression (use_updated_factors=False); ridge 1e-6 * trace/r on the "
        "r x r Gram solves; B factors start at 0, A factors ~ N(0, 0.02^2); v's bias correction matched to the factored "
        "second moment's build-up (v_bias_correction='surrogate', the default; Adam's 1 - beta2^t underestimates v ~28x "
        "at step 100 and, at full rank, makes LoRA-Pre diverge where AdamW trains)."
    )
    report.note(
        "GaLore is the authors' galore-torch 1.0 package (GaLoreAdamW, proj_type 'std', scale 0.25), eps 1e-8 like the "
        f"others; its projector refresh gap is scaled to the run length ({GALORE_REFRESHES} refreshes per run, as the card's "
        "gap 200 over 1200 steps)."
    )
    return report.finish()


# ---- (A) tracking a drifting momentum ------------------------------------------------------------------------------


def _tracking_experiment(report: Report, s: Settings, seed: int) -> TrackingResult:
    say(f"[lora-pre] tracking a drifting rank-{s.track_true_rank} EMA ({s.track_dim}x{s.track_dim}, {s.track_steps} steps)")
    result = track_drifting_momentum(
        dim=s.track_dim, true_rank=s.track_true_rank, rank=s.track_true_rank, steps=s.track_steps,
        refresh=s.track_refresh, measure_every=max(1, s.track_steps // 200), seed=seed,
    )
    burn_in = s.track_refresh // 2
    table = report.table("Tracking a drifting momentum (relative error of the rank-r estimate)", ["tracker", "mean error", "max error"])
    means = {}
    for name, errs in result.errors.items():
        means[name] = result.mean_error(name, after=burn_in)
        kept = [e for st, e in zip(result.steps, errs) if st > burn_in]
        table.add(**{"tracker": name, "mean error": means[name], "max error": max(kept)})
    # One random stream (seed `seed`): stated from it, INCONCLUSIVE until rerun over >= 3 streams.
    report.claim_from_runs(
        "tracking-near-oracle",
        "LoRA-Pre's rank-r momentum error stays near the best rank-r approximation's (ratio of mean errors)",
        [means["lora-pre"] / means["oracle"]], "<=", 1.5, kind=ClaimKind.PAPER)
    report.claim_from_runs(
        "tracking-beats-galore",
        "LoRA-Pre tracks the drifting EMA better than GaLore's refreshed projection (ratio of mean errors)",
        [means["lora-pre"] / means["galore"]], "<", 1.0, kind=ClaimKind.PAPER)
    return result


# ---- (B) pretraining -----------------------------------------------------------------------------------------------


def _optimizers(s: Settings) -> dict[str, OptimizerFactory]:
    """The harness's optimizer factories (lr, weight decay 0 and seed come from the TrainConfig)."""
    r, r8 = s.rank, max(1, s.rank // 8)
    gap = max(1, s.steps // GALORE_REFRESHES)
    return {
        "AdamW": adamw(),
        f"GaLore r={r}": galore(r, update_proj_gap=gap, scale=GALORE_SCALE),
        f"LoRA-Pre r={r}": lora_pre(r),
        f"LoRA-Pre r={r8}": lora_pre(r8),
    }


def _config(s: Settings, lr: float, seed: int) -> TrainConfig:
    """The one schedule every optimizer gets: same steps, batch (and seeded batch order), warmup, floor, clipping."""
    return TrainConfig(steps=s.steps, batch_size=s.batch, lr=lr, weight_decay=0.0, warmup_ratio=WARMUP_RATIO,
                       min_lr_ratio=MIN_LR_RATIO, max_grad_norm=CLIP_NORM, eval_every=s.eval_every, seed=seed)


def pretraining_model(s: Settings, seed: int) -> torch.nn.Module:
    """The freshly initialised Llama that experiment (B) pretrains at setup `s` (benchmarks/bench_lora_pre.py too)."""
    return tiny_llama(seed, hidden_size=s.hidden, num_layers=s.layers, num_heads=s.heads, num_kv_heads=s.kv_heads,
                      intermediate_size=s.intermediate, tie_word_embeddings=True)


def _pretraining_experiment(report: Report, s: Settings, seed: int) -> dict[str, TrainResult]:
    tokenizer = load_smollm2_tokenizer()
    train_windows = token_windows(tokenizer, s.train_split, s.seq_len)
    val = token_windows(tokenizer, "calibration", s.seq_len, s.val_windows)
    held_out = token_windows(tokenizer, "eval", s.seq_len, s.eval_windows)
    probe = pretraining_model(s, seed)
    n_params = sum(p.numel() for p in probe.parameters())
    low, _ = split_low_rank_params(probe)
    n_low = sum(p.numel() for _, p in low)
    tokens = s.steps * s.batch * s.seq_len
    say(f"[lora-pre] pretraining a {n_params / 1e6:.1f}M-parameter Llama for {tokens} tokens per run, lrs {s.lrs}")

    sweep = report.table("Learning-rate sweep (same grid for every optimizer)",
                         ["optimizer", "lr", "validation loss", "held-out loss", "wall s"])
    best: dict[str, tuple[float, float, TrainResult, int, int]] = {}  # name -> (val, lr, run, state bytes, matrix bytes)
    # lr-major order: every optimizer's first lr before any second one, so an interrupted run still compares them all
    for lr in s.lrs:
        for name, factory in _optimizers(s).items():
            model = pretraining_model(s, seed)
            task = LanguageModelingTask(train_windows, held_out, eval_batch_size=8, name=f"pretrain {name} lr={lr:g}")
            run_ = train(model, task, _config(s, lr, seed), optimizer=factory)
            val_loss = perplexity(model, val, batch_size=8, desc="validation").mean_nll
            matrices = [p for _, p in split_low_rank_params(model)[0]]
            state = (optimizer_state_bytes(run_.optimizer), optimizer_state_bytes(run_.optimizer, matrices))
            held = run_.final["eval_loss"]
            sweep.add(optimizer=name, lr=lr, **{"validation loss": val_loss, "held-out loss": held, "wall s": run_.wall_s})
            say(f"[lora-pre] {name} lr={lr:g}: validation {val_loss:.4f}, held-out {held:.4f}")
            if name not in best or val_loss < best[name][0]:
                best[name] = (val_loss, lr, run_, *state)

    adamw_total, adamw_matrix = best["AdamW"][3], best["AdamW"][4]
    table = report.table(
        f"Pretraining from scratch: {n_params / 1e6:.2f}M parameters ({n_low / 1e6:.2f}M in block matrices), "
        f"{tokens} tokens per run, held-out loss at the lr chosen on validation",
        ["optimizer", "lr", "held-out loss", "held-out ppl", "state bytes", "state / AdamW", "matrix state bytes", "matrix state / AdamW"],
    )
    loss = {}
    for name, (_, lr, run_, total, matrix) in best.items():
        loss[name] = run_.final["eval_loss"]
        table.add(optimizer=name, lr=lr, **{
            "held-out loss": loss[name], "held-out ppl": float(torch.tensor(loss[name]).exp()),
            "state bytes": total, "state / AdamW": total / adamw_total,
            "matrix state bytes": matrix, "matrix state / AdamW": matrix / adamw_matrix,
        })
    r, r8 = s.rank, max(1, s.rank // 8)
    # One pretraining run per optimizer: stated from it, INCONCLUSIVE until rerun over >= 3 seeds.
    lp_r, lp_r8, galore = loss[f"LoRA-Pre r={r}"], loss[f"LoRA-Pre r={r8}"], loss[f"GaLore r={r}"]
    report.claim_from_runs("rank-r-near-adamw", f"LoRA-Pre at rank {r} within 2% of AdamW's held-out loss (ratio)",
                 [lp_r / loss["AdamW"]], "<=", 1.02, kind=ClaimKind.PAPER)
    report.claim_from_runs("eighth-rank-matches-galore", f"LoRA-Pre at rank {r8} at least as good as GaLore at rank {r} (loss ratio)",
                 [lp_r8 / galore], "<=", 1.0, kind=ClaimKind.PAPER)
    report.claim_from_runs("lowest-loss", f"LoRA-Pre at rank {r} has the lowest held-out loss (ratio to the best of AdamW, GaLore)",
                 [lp_r / min(loss["AdamW"], galore)], "<=", 1.0, kind=ClaimKind.PAPER)
    report.note(
        f"Model: Llama, hidden {s.hidden}, {s.layers} layers, {s.heads} heads ({s.kv_heads} KV), SwiGLU {s.intermediate}, "
        f"tied 49152-token SmolLM2 embeddings; sequence {s.seq_len}, batch {s.batch}, {s.steps} steps, warmup 10% + cosine "
        "to 10% (reached at the last step), gradient clipping at norm 1, no weight decay, betas (0.9, 0.999), eps 1e-8; "
        "every optimizer trains through the same harness (rankwise.training.train) on the same seeded batches. "
        "Low-rank states cover the attention and MLP matrices; embeddings and norms keep AdamW states in every optimizer."
    )
    return {name: b[2] for name, b in best.items()}


# ---- plots ---------------------------------------------------------------------------------------------------------


def _tracking_plot(result: TrackingResult):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, errs in result.errors.items():
        ax.plot(result.steps, errs, label=name, lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("||m~ - m|| / ||m||")
    ax.set_title(f"Rank-r estimates of a drifting EMA (GaLore refresh every {result.refresh} steps)")
    ax.legend()
    return fig


def _loss_plot(runs: dict[str, TrainResult]):
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run_ in runs.items():
        steps, losses = zip(*[(h["step"], h["loss"]) for h in run_.history])
        smooth = torch.tensor(losses).unfold(0, min(5, len(losses)), 1).mean(1).tolist()
        left.plot(steps[len(steps) - len(smooth):], smooth, label=name, lw=1.2)
        es, el = zip(*run_.eval_curve("eval_loss"))
        right.plot(es, el, marker="o", label=name, lw=1.2)
    left.set_title("training loss (5-step mean)")
    right.set_title("held-out loss (eval split)")
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.set_ylabel("nats / token")
        ax.legend()
    return fig
