"""The arms of the GuardSpace reproduction and one training run of an arm.

Training arms share the rank, the targets, the steps and the batch (hence the trainable parameters and the budget):
plain LoRA; GuardSpace; GuardSpace with its projector replaced by a *control* of the same rank per module (the
null-space dimension k is kept, only the subspace changes): built from an unrelated theme's prompts, or uniformly
random (the "projector only" ablation config, LoRA's init with GuardSpace's P, is kept but not run). The Safe-LoRA-like defence is not
trained on its own: it is each LoRA run with its delta projected afterwards (`adapters.safe_projection`), so its
learning rate is chosen on its own validation score over the same runs.
"""

from __future__ import annotations

import math
import statistics as stats_
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rankwise.adapters import AdaptedModel, LoraConfig
from rankwise.adapters.guardspace import GuardSpaceConfig
from rankwise.adapters.guardspace_split import null_space_basis
from rankwise.adapters.safe_projection import safe_project
from rankwise.core.calibration import SecondMoment
from rankwise.core.linalg import symmetric_eigh
from rankwise.core.seed import set_seed
from rankwise.repro.guardspace.data import Sequence_, TopicPrompts
from rankwise.training import TrainConfig, train
from rankwise.training.frozen_prefix import IGNORE_INDEX, FrozenPrefixRunner
from rankwise.training.top_layers_lm import CachedSequencesLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA, GUARD, UNRELATED, RANDOM, PROJ_ONLY, SAFE = (
    "LoRA", "GuardSpace", "GuardSpace, unrelated-theme P", "GuardSpace, random P", "projector only (LoRA init)",
    "Safe-LoRA-like (LoRA + post-hoc P)")
GUARD_ARMS = (GUARD, UNRELATED, RANDOM)  # trained through a GuardPool (the controls with their P swapped)
# The projector-only ablation (PROJ_ONLY) is kept as a config but not run by the `full` budget (see the method page).
TRAINED_ARMS = (LORA, GUARD, UNRELATED, RANDOM)


def arm_config(arm: str, r: int, layers: list[int], null_threshold: float | None = None) -> LoraConfig | GuardSpaceConfig:
    """The adapter config of a trained arm; LoRA's alpha = 2r for all (scaling 2), no dropout. GuardSpace arms take
    `null_threshold` (the library default when None)."""
    common = dict(r=r, lora_alpha=2 * r, target_modules=TARGETS, layers_to_transform=layers)
    if arm == LORA:
        return LoraConfig(**common)
    if null_threshold is not None:
        common["null_threshold"] = null_threshold
    if arm == PROJ_ONLY:
        return GuardSpaceConfig(init="lora", **common)
    return GuardSpaceConfig(**common)  # GuardSpace and the two controls (their P is swapped after init)


def protected_bases(stats: dict[str, SecondMoment], threshold: float) -> dict[str, torch.Tensor]:
    """GuardSpace's null basis Q [k, in] (float64) per module, as the adapter builds it."""
    return {n: null_space_basis(symmetric_eigh(s.covariance()), threshold) for n, s in stats.items()}


def unrelated_bases(stats: dict[str, SecondMoment], dims: dict[str, int]) -> dict[str, torch.Tensor]:
    """Per module, the k = dims[name] least-used input directions of an unrelated prompt set: the same rank as
    GuardSpace's projector, built the same way, from the wrong prompts."""
    out = {}
    for n, s in stats.items():
        _, vectors = symmetric_eigh(s.covariance())  # ascending eigenvalues
        out[n] = vectors[:, : dims[n]].T.contiguous()
    return out


def random_bases(dims: dict[str, int], in_features: dict[str, int], seed: int) -> dict[str, torch.Tensor]:
    """Per module a uniformly random k-dimensional subspace (QR of a Gaussian), orthonormal rows [k, in]."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n in sorted(dims):
        gauss = torch.randn(in_features[n], dims[n], generator=g, dtype=torch.float64)
        out[n] = torch.linalg.qr(gauss).Q.T.contiguous()
    return out


@dataclass
class Evaluation:
    """What one trained model is scored on (all prefix states cached)."""

    runner: FrozenPrefixRunner
    val_h: list[torch.Tensor]
    val: TopicPrompts
    test_h: list[torch.Tensor]
    test: TopicPrompts
    prot_h: list[torch.Tensor]
    protected: list[Sequence_]
    pval_h: list[torch.Tensor]  # the validation protected prompts (protected and attacked too; for choosing tau)
    protected_val: list[Sequence_]
    held_h: list[torch.Tensor]
    heldout: list[Sequence_]
    base_prot: list[torch.Tensor]  # base logits at the answer positions
    base_pval: list[torch.Tensor]
    base_held: list[torch.Tensor]

    def task(self, hs: list[torch.Tensor], prompts: TopicPrompts) -> tuple[float, float]:
        """(first-token topic accuracy, mean answer NLL) of the current model."""
        logits = self.runner.per_sequence_logits(hs, [e.targets for e in prompts.examples])
        first = torch.stack([lg[0, prompts.label_first_tokens] for lg in logits])
        acc = float((first.argmax(-1) == torch.tensor(prompts.labels)).float().mean())
        nll = [float(torch.nn.functional.cross_entropy(lg, e.targets[e.targets != IGNORE_INDEX]))
               for lg, e in zip(logits, prompts.examples)]
        return acc, stats_.fmean(nll)

    def drift(self, hs: list[torch.Tensor], seqs: list[Sequence_], base: list[torch.Tensor]) -> tuple[float, float]:
        """Mean KL(base || tuned) per answer token, and the fraction of answers still greedy (teacher-forced)."""
        tuned = self.runner.per_sequence_logits(hs, [s.targets for s in seqs])
        kls, exact = [], []
        for b, t, s in zip(base, tuned, seqs):
            lb, lt = b.log_softmax(-1), t.log_softmax(-1)
            kls.append(float((lb.exp() * (lb - lt)).sum(-1).mean()))
            exact.append(bool((t.argmax(-1) == s.targets[s.targets != IGNORE_INDEX]).all()))
        return stats_.fmean(kls), stats_.fmean(exact)

    @torch.no_grad()
    def score(self) -> dict[str, float]:
        val_acc, val_loss = self.task(self.val_h, self.val)
        acc, loss = self.task(self.test_h, self.test)
        kl_p, em_p = self.drift(self.prot_h, self.protected, self.base_prot)
        kl_v, em_v = self.drift(self.pval_h, self.protected_val, self.base_pval)
        kl_h, em_h = self.drift(self.held_h, self.heldout, self.base_held)
        return dict(val_accuracy=val_acc, val_loss=val_loss, accuracy=acc, eval_loss=loss, protected_KL=kl_p,
                    protected_exact=em_p, val_protected_KL=kl_v, val_protected_exact=em_v, heldout_KL=kl_h,
                    heldout_exact=em_h)


class CachedTask(CachedSequencesLM):
    """The fine-tuning set (task articles and overwrite answers) as the harness's cached-sequences task: prefix states
    `train_h` [T_i, D] and the sequences' targets (evaluation is done by `Evaluation`)."""

    name = "wiki-topics+overwrite"
    metric = "val_loss"

    def __init__(self, runner: FrozenPrefixRunner, train_h: list[torch.Tensor], train_seqs: list[Sequence_]) -> None:
        super().__init__(runner, train_h, [q.targets for q in train_seqs])


class GuardPool:
    """One GuardSpace adapter ("guard") built once and reset per run: its init is deterministic (no random draw), so
    restoring the initial A, B and setting the arm's null basis Q gives exactly a freshly built adapter, without
    redoing the per-module eigendecompositions and SVDs for each of the many runs."""

    def __init__(self, adapted: AdaptedModel, rank: int, layers: list[int], statistics: dict[str, SecondMoment],
                 null_threshold: float) -> None:
        self.adapted = adapted
        self.NAME = "guard_" + f"{null_threshold:.0e}".translate(str.maketrans("-+.", "mp_"))  # an identifier
        adapted.add_adapter(self.NAME, arm_config(GUARD, rank, layers, null_threshold), statistics=statistics)
        self.initial = {n: {k: v.detach().clone() for k, v in a.state_dict().items()}
                        for n, a in adapted.adapters_of(self.NAME).items()}
        adapted.set_adapter([])

    @torch.no_grad()
    def activate(self, bases: dict[str, torch.Tensor] | None) -> dict:
        """Reset to the initial state, with `bases` (module -> Q [k, in]) instead of GuardSpace's own when given."""
        self.adapted.set_adapter(self.NAME)
        adapters = self.adapted.adapters_of(self.NAME)
        for name, adapter in adapters.items():
            init = self.initial[name]
            adapter.A.copy_(init["A"])
            adapter.B.copy_(init["B"])
            q = init["Q"] if bases is None else bases[name].to(init["Q"].dtype)
            if q.shape != init["Q"].shape:
                raise AssertionError(f"{name}: control basis {tuple(q.shape)} vs GuardSpace's {tuple(init['Q'].shape)}")
            adapter.Q = q.clone()
        return adapters


def train_arm(adapted: AdaptedModel, arm: str, lr: float, seed: int, *, rank: int, layers: list[int],
              pool: GuardPool, controls: Callable[[str, int], dict[str, torch.Tensor]],
              task: CachedTask, evaluation: Evaluation, steps: int, batch: int,
              safe_bases: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Train one arm at (lr, seed) and score it: {arm: scores} (LoRA also yields the Safe-LoRA-like scores).

    `pool` (GuardSpace at one null threshold) serves GuardSpace and the controls; `controls(arm, seed)` gives the
    replacement null bases of a control arm (of the pool's dimensions). Scores of a diverged run are NaN.
    """
    set_seed(seed)
    lora = arm not in GUARD_ARMS
    if lora:
        adapted.add_adapter("run", arm_config(arm, rank, layers))
        adapters = adapted.adapters_of("run")
    else:
        adapters = pool.activate(controls(arm, seed) if arm in (UNRELATED, RANDOM) else None)
    try:
        trainable = adapted.count_parameters().trainable
        result = train(adapted, task, TrainConfig(steps=steps, batch_size=batch, lr=lr, seed=seed))
        out = {arm: {**evaluation.score(), "final_train_loss": result.losses[-1], "train_s": result.wall_s,
                     "trainable": trainable}}
        if arm == LORA:
            records = safe_project(adapters, safe_bases)
            out[SAFE] = {**evaluation.score(), "final_train_loss": float("nan"), "train_s": result.wall_s,
                         "trainable": trainable, "projected_layers": sum(r.projected for r in records.values())}
    finally:
        if lora:
            adapted.delete_adapter("run")
        adapted.set_adapter([])
    for scores in out.values():
        if not math.isfinite(scores["val_loss"]):
            scores.update({k: float("nan") for k in scores if k != "trainable"})
    return out
