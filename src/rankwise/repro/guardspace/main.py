"""Reproduction `guardspace`: fine-tuning on data that tries to overwrite a protected behaviour; GuardSpace keeps it.

Scaled stand-in for the paper's harmful fine-tuning (card guardspace.md, "CPU-scale reproduction"): the protected
behaviour is SmolLM2's own greedy answers to 16 chat prompts on a fixed theme; the fine-tuning set is a benign task
(wiki-topics as generation, 200 examples) plus 10% "overwrite" examples that pair protected prompts with a different
answer. LoRA, GuardSpace and its two ablations (init only = CorDA knowledge-preserving, no projector; projector
only = LoRA init + P) train the top layers with the same rank (same trainable parameters), steps, batch and learning
rate. Measured: drift of the protected answers (KL(base || tuned) over the answer tokens, greedy exact match), the
same on 8 held-out prompts of the theme, and task accuracy / loss on held-out articles.
"""

from __future__ import annotations

import statistics as stats_
from dataclasses import dataclass

import torch

from rankwise.adapters import AdaptedModel, LoraConfig, find_targets
from rankwise.adapters.guardspace import GuardSpaceConfig
from rankwise.core.calibration import collect_second_moments
from rankwise.core.evidence import ClaimKind
from rankwise.core.padding import pad_batch
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.repro.guardspace.data import (
    GARDENING_PROMPTS, OVERWRITE_ANSWER, Sequence_, chat_prompt, greedy_continuations, topic_generation, with_answer,
)
from rankwise.repro.setup import BySize, experiment_model
from rankwise.training import TrainConfig, train
from rankwise.training.frozen_prefix import IGNORE_INDEX, FrozenPrefixRunner

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Settings:
    top_layers: int  # adapters on the top layers only (the prefix below them is computed once and cached)
    rank: int
    protected: int  # protected prompts
    heldout: int  # held-out prompts of the protected theme
    train: int  # task examples
    eval: int
    overwrite: int  # examples that try to overwrite the protected answers
    words: int
    new_tokens: int
    steps: int
    batch: int
    lr: float


SIZES = BySize(
    smoke=Settings(top_layers=1, rank=4, protected=2, heldout=1, train=8, eval=6, overwrite=1, words=6, new_tokens=3,
                   steps=2, batch=4, lr=1e-3),
    full=Settings(top_layers=8, rank=8, protected=16, heldout=8, train=200, eval=120, overwrite=20, words=20, new_tokens=12,
                  steps=80, batch=4, lr=1e-3),
)
VARIANTS = {  # name -> config factory (rank r); LoRA's alpha = 2r for all (scaling 2)
    "LoRA": lambda r, layers: LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS, layers_to_transform=layers),
    "init only (no P)": lambda r, layers: GuardSpaceConfig(r=r, lora_alpha=2 * r, projector=False, target_modules=TARGETS, layers_to_transform=layers),
    "projector only (LoRA init)": lambda r, layers: GuardSpaceConfig(r=r, lora_alpha=2 * r, init="lora", target_modules=TARGETS, layers_to_transform=layers),
    "GuardSpace": lambda r, layers: GuardSpaceConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS, layers_to_transform=layers),
}


class CachedTask:
    """The fine-tuning set as a harness task over cached prefix states; evaluation is topic accuracy."""

    name = "wiki-topics+overwrite"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, runner: FrozenPrefixRunner, train_h: list[torch.Tensor], train_seqs: list[Sequence_], evaluate) -> None:
        self.runner, self.train_h, self.train_seqs, self._evaluate = runner, train_h, train_seqs, evaluate

    @property
    def num_train(self) -> int:
        return len(self.train_seqs)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        idx = indices.tolist()
        return {"h": pad_batch([self.train_h[i] for i in idx], 0.0), "targets": pad_batch([self.train_seqs[i].targets for i in idx], IGNORE_INDEX)}

    def loss(self, module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.runner.loss(batch["h"], batch["targets"])

    def evaluate(self, module) -> dict[str, float]:
        return self._evaluate()


def _ids(seqs: list[Sequence_]) -> list[torch.Tensor]:
    return [s.ids for s in seqs]


def _targets(seqs: list[Sequence_]) -> list[torch.Tensor]:
    return [s.targets for s in seqs]


def _drift(base: list[torch.Tensor], tuned: list[torch.Tensor], seqs: list[Sequence_]) -> tuple[float, float]:
    """Mean KL(base || tuned) per answer token, and the fraction of sequences whose answer is still the greedy one."""
    kls, exact = [], []
    for b, t, s in zip(base, tuned, seqs):
        lb, lt = b.log_softmax(-1), t.log_softmax(-1)
        kls.append(float((lb.exp() * (lb - lt)).sum(-1).mean()))
        exact.append(bool((t.argmax(-1) == s.targets[s.targets != IGNORE_INDEX]).all()))
    return stats_.fmean(kls), stats_.fmean(exact)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("guardspace", "GuardSpace: protected outputs survive fine-tuning that tries to overwrite them", size, seed)
    set_seed(seed)
    model, tok = experiment_model("smollm2-135m", size, seed, hidden_size=128, intermediate_size=256, num_layers=2,
                                  num_heads=4, num_kv_heads=2)
    n_layers = model.config.num_hidden_layers
    start = n_layers - s.top_layers
    layers = list(range(start, n_layers))
    runner = FrozenPrefixRunner(model, start)

    # Protected behaviour: the base model's own greedy answers (prompt and answer tokens are both protected).
    prompts = [chat_prompt(tok, q) for q in GARDENING_PROMPTS[: s.protected + s.heldout]]
    answers = greedy_continuations(model, prompts, s.new_tokens)
    chat = [with_answer(p, a) for p, a in zip(prompts, answers)]
    protected, heldout = chat[: s.protected], chat[s.protected :]
    overwrite_ids = tok(OVERWRITE_ANSWER, add_special_tokens=False)["input_ids"]
    overwrite = [with_answer(prompts[i % s.protected], overwrite_ids) for i in range(s.overwrite)]
    task_train = topic_generation(tok, "train", s.train, s.words)
    task_eval = topic_generation(tok, "eval", s.eval, s.words)
    train_seqs = task_train.examples + overwrite

    say("caching prefix states")
    train_h, eval_h = runner.prefix(_ids(train_seqs)), runner.prefix(_ids(task_eval.examples))
    prot_h, held_h = runner.prefix(_ids(protected)), runner.prefix(_ids(heldout))
    with torch.no_grad():  # the frozen-prefix path must compute what the full model computes
        full = model(input_ids=protected[0].ids[None]).logits[0]
        part = model.lm_head(runner.top(prot_h[0][None]))[0]
        prefix_error = float((full - part).abs().max() / full.abs().max())
    base_prot, base_held = runner.per_sequence_logits(prot_h, _targets(protected)), runner.per_sequence_logits(held_h, _targets(heldout))

    def evaluate() -> dict[str, float]:
        logits = runner.per_sequence_logits(eval_h, _targets(task_eval.examples))
        first = torch.stack([lg[0, task_eval.label_first_tokens] for lg in logits])
        labels = torch.tensor(task_eval.labels)
        nll = [float(torch.nn.functional.cross_entropy(lg, ex.targets[ex.targets != IGNORE_INDEX])) for lg, ex in zip(logits, task_eval.examples)]
        return {"accuracy": float((first.argmax(-1) == labels).float().mean()), "eval_loss": stats_.fmean(nll)}

    base_task = evaluate()
    names = find_targets(model, VARIANTS["GuardSpace"](s.rank, layers))
    statistics = collect_second_moments(model, names, [p.ids[None] for p in protected], desc="protected statistics")
    protected_tokens = sum(len(p) for p in protected)

    table = report.table("methods, same rank and trainable parameters", [
        "method", "trainable", "task_accuracy", "task_eval_loss", "protected_KL", "protected_exact", "heldout_KL",
        "heldout_exact", "final_train_loss", "train_s"])
    table.add(method="base (no fine-tuning)", trainable=0, task_accuracy=base_task["accuracy"], task_eval_loss=base_task["eval_loss"],
              protected_KL=0.0, protected_exact=_drift(base_prot, base_prot, protected)[1], heldout_KL=0.0,
              heldout_exact=_drift(base_held, base_held, heldout)[1], final_train_loss=float("nan"), train_s=0.0)
    adapted = AdaptedModel(model)
    rows: dict[str, dict] = {}
    null_dims: list[int] = []
    for name, factory in VARIANTS.items():
        set_seed(seed)
        adapted.add_adapter("run", factory(s.rank, layers), statistics=statistics)
        if name == "GuardSpace":
            null_dims = [a.null_dim for a in adapted.adapters_of("run").values()]
        task = CachedTask(runner, train_h, train_seqs, evaluate)
        result = train(adapted, task, TrainConfig(steps=s.steps, batch_size=s.batch, lr=s.lr, seed=seed))
        kl_p, em_p = _drift(base_prot, runner.per_sequence_logits(prot_h, _targets(protected)), protected)
        kl_h, em_h = _drift(base_held, runner.per_sequence_logits(held_h, _targets(heldout)), heldout)
        rows[name] = dict(method=name, trainable=adapted.count_parameters().trainable, task_accuracy=result.final["accuracy"],
                          task_eval_loss=result.final["eval_loss"], protected_KL=kl_p, protected_exact=em_p, heldout_KL=kl_h,
                          heldout_exact=em_h, final_train_loss=result.losses[-1], train_s=result.wall_s)
        table.add(**rows[name])
        adapted.delete_adapter("run")

    g, lora, init_only, proj_only = rows["GuardSpace"], rows["LoRA"], rows["init only (no P)"], rows["projector only (LoRA init)"]
    tiny = 1e-12  # keeps ratios finite when GuardSpace's drift is exactly zero
    # One training run per variant (seed `seed`): the claims are stated from it but stay INCONCLUSIVE until the
    # evidence rework runs them over >= 3 seeds.
    report.claim_from_runs("guardspace_preserves_protected", "GuardSpace: mean KL(base||tuned) on the protected answers stays ~0 (<= 1e-3 nats/token)",
                 [g["protected_KL"]], "<=", 1e-3, kind=ClaimKind.PAPER)
    report.claim_from_runs("guardspace_keeps_answers", "GuardSpace: fraction of protected prompts whose greedy answer is unchanged", [g["protected_exact"]], ">=", 0.9, kind=ClaimKind.PAPER)
    report.claim_from_runs("lora_drifts", "LoRA's protected KL is >= 10x GuardSpace's (the overwrite data changes LoRA's answers)",
                 [lora["protected_KL"] / max(g["protected_KL"], tiny)], ">=", 10.0, kind=ClaimKind.PAPER)
    report.claim_from_runs("task_comparable", "GuardSpace task accuracy minus LoRA's (comparable utility: >= -0.05)",
                 [g["task_accuracy"] - lora["task_accuracy"]], ">=", -0.05, kind=ClaimKind.PAPER)
    report.claim_from_runs("projector_carries_protection", "ablation: without P (init only) the protected KL is >= 10x GuardSpace's",
                 [init_only["protected_KL"] / max(g["protected_KL"], tiny)], ">=", 10.0, kind=ClaimKind.PAPER)
    report.claim_from_runs("init_helps_utility", "ablation: GuardSpace task eval loss minus projector-only's (the init helps: <= 0)",
                 [g["task_eval_loss"] - proj_only["task_eval_loss"]], "<=", 0.0, kind=ClaimKind.PAPER)
    report.claim_from_runs("heldout_drift_lower", "held-out prompts of the theme: GuardSpace KL / LoRA KL (thresholded P generalises: < 1)",
                 [g["heldout_KL"] / max(lora["heldout_KL"], tiny)], "<", 1.0, kind=ClaimKind.PAPER)

    report.note(f"Model: {'SmolLM2-135M-Instruct' if size == 'full' else 'tiny random Llama'}; adapters on "
                f"{', '.join(TARGETS)} of layers {start}..{n_layers - 1}, rank {s.rank}, alpha {2 * s.rank}; "
                f"{s.steps} AdamW steps, batch {s.batch}, lr {s.lr} (warmup 10% + cosine, clip 1.0), seed {seed}.")
    report.note(f"Protected set: {len(protected)} chat prompts + the base model's {s.new_tokens}-token greedy answers "
                f"({protected_tokens} tokens); held-out: {len(heldout)} prompts of the same theme. Fine-tuning data: "
                f"{len(task_train.examples)} topic examples + {len(overwrite)} overwrite examples answering "
                f"{OVERWRITE_ANSWER!r}.")
    if null_dims:
        report.note(f"GuardSpace null-space dimension per adapted module (null_threshold "
                    f"{GuardSpaceConfig.null_threshold}): min {min(null_dims)}, median {int(stats_.median(null_dims))}, "
                    f"max {max(null_dims)}.")
    report.note(f"Frozen-prefix execution (lower layers run once per sequence) matches the full forward to "
                f"{prefix_error:.1e} (max relative logit error).")
    report.note("Exact match is teacher-forced: every answer position's argmax equals the base answer token, which is "
                "equivalent to greedy decoding reproducing the whole answer.")
    report.plots["drift_vs_accuracy"] = _plot(rows)
    return report.finish()


def _plot(rows: dict[str, dict]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, r in rows.items():
        ax.scatter(max(r["protected_KL"], 1e-9), r["task_accuracy"], s=50)
        ax.annotate(name, (max(r["protected_KL"], 1e-9), r["task_accuracy"]), fontsize=8, xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("protected drift: KL(base || tuned) per answer token")
    ax.set_ylabel("task accuracy (held-out articles)")
    ax.set_title("GuardSpace vs LoRA: drift against utility")
    return fig
