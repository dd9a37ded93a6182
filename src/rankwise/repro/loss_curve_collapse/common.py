"""What the three loss-curve-collapse experiments share: the testbed's data and batch shape, a memoising runner of
family members, the tau-fixed LR sweep that sets the family's learning rate, the testbed string every changed claim
carries, and the checks (invariants, sanity) each experiment declares on its own runs.

The family's learning rate is chosen the muP way: a tau-fixed sweep at the smallest width, on the held-out eval loss,
then reused at every width. `main` checks that choice against a sweep at the largest width; `faults` reruns the same
(cheap) small-width sweep so that its runs train at the rate `main`'s family does, without sharing a process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rankwise.core.arms import Selection, select_from_scores
from rankwise.core.evidence import Claim, ClaimKind
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.data import token_windows
from rankwise.data.compact_vocab import byte_tokenizer
from rankwise.errors import InvalidInputError
from rankwise.recipes.loss_curve_collapse import weight_decay_for_timescale
from rankwise.repro.loss_curve_collapse import analysis as A
from rankwise.repro.loss_curve_collapse.family import (BASE_WIDTH, DECAY, HEAD_DIM, LAYERS, WARMUP_RATIO, RunResult,
                                                       RunSpec, run_one, steps_for)

SLUG = "loss-curve-collapse"
FALLING_FROM = 0.9  # loss_still_falling compares the smoothed loss at t_hat = 1 with its value here


@dataclass(frozen=True)
class Testbed:
    """The data and batch shape every run of an experiment shares (the model family is `family`'s)."""

    batch_size: int  # sequences per step
    seq_len: int  # tokens per sequence
    eval_windows: int  # held-out windows of the validation score
    window: float  # EMA time constant of the smoothed curves, in t_hat

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 2 or self.eval_windows < 1 or not 0 < self.window < 1:
            raise InvalidInputError(f"bad testbed {self}: need batch_size >= 1, seq_len >= 2, eval_windows >= 1 and "
                                    "a smoothing window in (0, 1)")

    @property
    def batch_tokens(self) -> int:
        return self.batch_size * self.seq_len

    def describe(self, widths: Sequence[int], tpp: float | Sequence[float], tau: float) -> str:
        """The testbed string of a claim (part of its fingerprint): another family, schedule or batch is another
        claim."""
        tpps = "/".join(f"{t:g}" for t in tpp) if isinstance(tpp, Sequence) else f"{tpp:g}"
        return (f"byte-level muP Llama, {LAYERS} layers, head dim {HEAD_DIM}, base width {BASE_WIDTH}, widths "
                f"{'/'.join(map(str, widths))}; wiki corpus; batch {self.batch_size} x {self.seq_len} tokens; TPP "
                f"{tpps} (non-embedding N); {WARMUP_RATIO:.0%} warmup + {DECAY} decay to zero; AdamW (0.9, 0.95); "
                f"tau {tau:g}")


@dataclass(frozen=True)
class FaultWindow:
    """Where the faults of the detection experiment act (fractions of training) and how hard."""

    at: float = 0.5
    spike_len: float = 0.02
    stuck_len: float = 0.05
    spike: float = 3.0


class Runner:
    """Runs (and memoises) training runs of the family on shared windows; one training run per distinct RunSpec."""

    def __init__(self, bed: Testbed, faults: FaultWindow = FaultWindow()) -> None:
        tok = byte_tokenizer()
        self.bed, self.faults = bed, faults
        self.train = token_windows(tok, "train", bed.seq_len)
        self.eval = token_windows(tok, "eval", bed.seq_len, bed.eval_windows)
        self.memo: dict[RunSpec, RunResult] = {}

    def __call__(self, spec: RunSpec) -> RunResult:
        if spec not in self.memo:
            self.memo[spec] = self.fresh(spec)
        return self.memo[spec]

    def fresh(self, spec: RunSpec) -> RunResult:
        """A new training run of `spec`, never memoised (the determinism check)."""
        f = self.faults
        length = f.spike_len if spec.fault == "lr_spike" else f.stuck_len
        return run_one(spec, self.train, self.eval, self.bed.batch_size, f.at, length, f.spike)

    def steps(self, width: int, tpp: float) -> int:
        return steps_for(width, tpp, self.bed.batch_tokens)[0]

    def fixed_lambda(self, tau: float, lr: float, width: int, tpp: float) -> float:
        """The lambda that gives the hidden matrices timescale `tau` at (lr, width, tpp): a lambda-fixed arm's
        constant."""
        return weight_decay_for_timescale(tau, lr * BASE_WIDTH / width, self.steps(width, tpp))


def lr_sweep(run: Runner, width: int, tpp: float, lrs: Sequence[float], rule: str, value: float, seeds: int,
             seed: int, what: str) -> tuple[Selection, list[list[RunResult]]]:
    """Train every LR of `lrs` for `seeds` seeds (seed + i) and choose on the mean held-out eval loss.
    -> (selection, runs[seed index][lr index])"""
    runs = []
    for i in range(seeds):
        say(f"{what}, seed {i + 1}/{seeds}")
        runs.append([run(RunSpec(width, tpp, lr, rule, value, seed + i)) for lr in lrs])
    finals = np.array([[r.eval_loss for r in per_seed] for per_seed in runs])  # [seeds, lrs]
    return select_from_scores(tuple(lrs), finals.mean(0).tolist(), higher_is_better=False, param="lr"), runs


def family_lr(report: Report, run: Runner, width: int, tpp: float, lrs: Sequence[float], tau: float, seeds: int,
              seed: int) -> Selection:
    """The family's LR: a tau-fixed sweep at the smallest width (muP: tune small, transfer), recorded as an arm."""
    sel, _ = lr_sweep(run, width, tpp, lrs, "tau", tau, seeds, seed, f"LR sweep, width {width}, tau fixed")
    report.record_arm(f"family LR (tau fixed, width {width})", sel,
                      budget={"tpp": tpp, "runs_per_lr": seeds, "steps": run.steps(width, tpp)})
    return sel


def declare_checks(report: Report, testbed: str) -> None:
    """The invariants and sanity checks every experiment evaluates on its own runs. The invariants and
    `single_epoch` keep their names and definitions (they hold on any testbed); `loss_still_falling_d2z` replaces
    `loss_still_falling` (cosine schedule, batch 32) on this testbed."""
    I, S = ClaimKind.INVARIANT, ClaimKind.SANITY
    report.declare(Claim("normalised_curve_ends_at_one", "max over runs of |l(1) - 1|", "<=", 1e-12, kind=I))
    report.declare(Claim("timescale_as_declared", "max over tau-fixed runs and decayed groups of |B / (eta_g lambda_g "
                         "D) / tau - 1| from the optimizer's own settings", "<=", 1e-9, kind=I))
    report.declare(Claim("same_seed_same_curve", "max |loss difference| between two runs of one configuration and "
                         "seed", "<=", 0.0, kind=I))
    report.declare(Claim("single_epoch", "max over runs of training tokens / tokens in the train split", "<=", 1.0,
                         kind=S))
    report.declare(Claim("loss_still_falling_d2z", f"clean runs whose smoothed loss at t_hat = 1 is not below its "
                         f"value at t_hat = {FALLING_FROM} (the card's pitfall: a plateaued run cannot collapse)", "<=",
                         0, kind=S, testbed=testbed, post_hoc=True))


def measure_checks(report: Report, run: Runner, rerun: RunResult) -> None:
    """Measure `declare_checks`' claims over every run `run` made; `rerun` is the run retrained for determinism."""
    bed, runs = run.bed, list(run.memo.values())
    report.measure("normalised_curve_ends_at_one", max(abs(A.normalised(r, bed.window).final - 1) for r in runs))
    taus = [abs(t / r.spec.value - 1) for r in runs if r.spec.rule == "tau" for t in r.group_taus]
    report.measure("timescale_as_declared", max(taus) if taus else None)
    again = run.fresh(rerun.spec)
    report.measure("same_seed_same_curve", float(np.abs(again.curve.loss - rerun.curve.loss).max()))
    train_tokens = run.train.numel()
    report.measure("single_epoch", max(float(r.curve.loss.size * bed.batch_tokens) / train_tokens for r in runs))
    flat = [r.spec for r in runs if r.spec.fault is None and not falling(r, bed.window)]
    report.measure("loss_still_falling_d2z", len(flat))
    if flat:  # which runs: a plateaued LR-sweep run at a bad LR matters less than a plateaued family member
        groups: dict[tuple, int] = {}
        for spec in flat:
            key = (spec.width, spec.tpp, spec.lr, spec.rule)
            groups[key] = groups.get(key, 0) + 1
        report.note("Runs whose smoothed loss no longer falls over the last 10% (loss_still_falling_d2z), as "
                    "(width, TPP, LR, rule) -> seeds: " + "; ".join(
                        f"({w}, {t:g}, {lr:g}, {rule}) -> {n}" for (w, t, lr, rule), n in sorted(groups.items())) + ".")


def falling(run: RunResult, window: float) -> bool:
    sm = A.smoothed(run, window)
    return sm.final < float(sm.at([FALLING_FROM])[0])


def last_drop(run: RunResult, window: float) -> float:
    """L(0.9) / L(1) - 1 of the smoothed curve: how much the last 10% of training still gains (0: plateaued)."""
    sm = A.smoothed(run, window)
    return float(sm.at([FALLING_FROM])[0]) / sm.final - 1.0


def schedule_note(report: Report) -> None:
    report.note(f"Schedule: {WARMUP_RATIO:.0%} linear warmup, then linear decay to zero (the paper's and the card's; "
                "the previous design used the harness's cosine). Every run shares the shape in t_hat. N counts "
                "non-embedding parameters; TPP = training tokens / N.")
