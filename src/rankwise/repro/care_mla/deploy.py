"""The deployable-MLA reproduction: SmolLM2 at 50 % KV saving with a latent-only cache; CARE's init heals better.

    rankwise repro care-mla:deploy --size full      # writes docs/results/care-mla/deploy/

The paper's claim (its healing table): after the same recovery fine-tune, a model initialised with CARE's
covariance-aware factors beats one initialised with the baselines' factors. Arms, all at the same cache
(r_K = r_V = kv_rank plus a shared rope key): CARE (sqrt(C)-whitened SVD), Palu (plain SVD of each matrix) and
MHA2MLA-style (plain SVD with MHA2MLA's 2-norm-contribution partial-RoPE pairs). Each arm's RoPE pairs and healing
learning rate are chosen on calibration-split windows (never the evaluation split); the arms then heal with the
same budget (`rankwise.training.healing`), over calibration seeds (different calibration windows and healing
order), and are compared paired by seed on held-out eval-split perplexity.
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass, replace

import torch

from rankwise.compress.mla.calibration import calibration_windows, kv_input_moments
from rankwise.compress.mla.convert import convert_to_mla
from rankwise.compress.mla_deploy.build import convert_to_deployable_mla, deploy_info, expected_cache_bytes_per_token, mla_parameters
from rankwise.compress.mla_deploy.checks import absorbed_vs_expanded, generation_mismatches
from rankwise.compress.mla_deploy.export import export_deepseek_v3, load_deepseek_v3
from rankwise.core.arms import select_on_validation
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.data import token_windows
from rankwise.eval import measured_kv_bytes_per_token, perplexity
from rankwise.repro.setup import BySize, experiment_model
from rankwise.training.healing import HealConfig, heal

SELECTIONS = ("high", "uniform", "contribution", "sensitivity")


@dataclass(frozen=True)
class InitArm:
    label: str
    method: str  # the latent factorization (compress.mla.METHODS)
    selections: tuple[str, ...]  # RoPE pair selections the arm chooses from on calibration data


ARMS = (
    InitArm("CARE", "care", SELECTIONS),
    InitArm("Palu (SVD)", "svd", SELECTIONS),
    InitArm("MHA2MLA-style", "svd", ("contribution",)),  # MHA2MLA's own recipe: S_2-norm pairs, unwhitened SVD
)
CARE, BASELINES = ARMS[0].label, tuple(a.label for a in ARMS[1:])


@dataclass(frozen=True)
class Settings:
    calib_samples: int
    calib_len: int
    eval_windows: int
    eval_len: int
    select_windows: int  # calibration-split windows of eval_len tokens: the validation set for pairs and learning rate
    heal: HealConfig
    heal_len: int
    heal_windows: int
    lr_grid: tuple[float, ...]
    seeds: int


SIZES = BySize(
    smoke=Settings(48, 16, 3, 32, 2, HealConfig(steps=4, batch_size=2, lr=2e-3, checkpoint_every=2), 32, 16, (1e-3, 3e-3), 3),
    full=Settings(256, 32, 8, 256, 4, HealConfig(steps=30, batch_size=2, lr=2e-4, checkpoint_every=1000), 64, 2000,
                  (3e-4, 1e-3, 3e-3), 3),
)


def _declare(report: Report, sz: Settings) -> None:
    for base in BASELINES:
        report.declare(PairedClaim(
            f"care_heals_better_than_{_slug(base)}", f"after the same healing, CARE's init beats {base}'s: log PPL(CARE healed) - "
            f"log PPL({base} healed) on held-out text, paired over {sz.seeds} calibration seeds", "<", 0.0, kind=ClaimKind.PAPER))
    report.declare(SampleClaim("healing_lowers_perplexity", f"CARE: perplexity after healing / before, {sz.seeds} seeds", "<", 1.0,
                               kind=ClaimKind.SANITY))
    for name, text, op, threshold in (
        ("cache_bytes_equal_expected", "|measured - expected| latent-cache bytes per token (cache tensors of a forward)", "<=", 0),
        ("kv_saving_50pct", "measured KV-cache saving vs the GQA model", ">=", 0.5),
        ("absorbed_equals_expanded", "max |logit| difference, absorbed vs expanded decoding (prefill + 4 cached steps), "
         "relative to the logits' max magnitude; bound: float32 rounding of a hidden-size (576-term) sum, 576 x 1.2e-7 ~ 1e-4", "<=", 1e-4),
        ("generate_equals_no_cache", "tokens where model.generate (latent cache) differs from no-cache greedy decoding", "<=", 0),
        ("export_perplexity_gap", "relative perplexity gap, exported DeepSeek-V3 checkpoint vs our module", "<=", 1e-3),
    ):
        report.declare(Claim(name, text, op, threshold, kind=ClaimKind.INVARIANT))


def _slug(label: str) -> str:
    return label.split()[0].lower().replace("-style", "").replace("-", "")


def run(size: str = "smoke", seed: int = 0) -> Report:
    """SmolLM2 (full) or a tiny random Llama (smoke) converted to deployable MLA at 50 % KV saving; see the claims."""
    report = Report("care-mla", "CARE deployable MLA: latent-only KV cache, absorbed decoding, DeepSeek-V3 export, healing", size, seed)
    sz = SIZES[size]
    _declare(report, sz)
    set_seed(seed)
    teacher, tokenizer = experiment_model("smollm2-135m", size, seed)
    cfg = teacher.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_width = cfg.num_key_value_heads * head_dim
    rope_dims = head_dim // 2
    kv_rank = (kv_width - rope_dims) // 2  # 2 r + rope = kv_width: half of the GQA cache's 2 * kv_width
    seeds = [seed + i for i in range(sz.seeds)]
    calib_pool = token_windows(tokenizer, "calibration", sz.calib_len)
    # validation: calibration-split text at the evaluation's window length (RoPE pairs act across distances)
    select = token_windows(tokenizer, "calibration", sz.eval_len, sz.select_windows)
    evals = token_windows(tokenizer, "eval", sz.eval_len, sz.eval_windows)
    train = token_windows(tokenizer, "train", sz.heal_len, sz.heal_windows)
    saving = 1 - (2 * kv_rank + rope_dims) / (2 * kv_width)
    report.note(
        f"Budget: r_K = r_V = {kv_rank} latent dims per layer plus a shared rope key of {rope_dims} = {2 * kv_rank + rope_dims} numbers "
        f"per token and layer, against {2 * kv_width} for GQA K+V. Calibration {sz.calib_samples} x {sz.calib_len} tokens per seed "
        f"(wiki calibration split); RoPE pairs and healing learning rate chosen on {sz.select_windows} x {sz.eval_len} calibration-split "
        f"tokens; perplexity on {sz.eval_windows} x {sz.eval_len} held-out tokens (eval split); healing on the train split."
    )

    ppl = report.table("perplexity", ["model", "kv_saving", "perplexity", "vs_original"])
    base = perplexity(teacher, evals).perplexity
    ppl.add(model="original GQA", kv_saving=0.0, perplexity=base, vs_original=1.0)
    first_calib = calibration_windows(calib_pool, sz.calib_samples, seeds[0])
    moments = kv_input_moments(teacher, first_calib)
    oneshot = convert_to_mla(teacher, kv_rank=kv_width // 2, method="care", allocation="uniform", calibration=moments)
    one = perplexity(oneshot, evals).perplexity
    ppl.add(model=f"CARE one-shot r={kv_width // 2} (RoPE after up-projection; not a latent cache)", kv_saving=0.5, perplexity=one, vs_original=one / base)
    del oneshot

    # 1. each arm's RoPE pairs, chosen on calibration-split text (first seed's calibration)
    say("deploy report: choosing each arm's rope pairs on calibration data")
    rope = report.table("rope selection (validation = calibration-split windows)", ["arm", "selection", "pairs kept", "rope key energy kept", "validation perplexity"])
    chosen: dict[str, str] = {}
    best: dict[str, tuple[float, torch.nn.Module]] = {}  # per arm, the first seed's converted model at its best pairs
    for arm in ARMS:
        def score(selection: str, arm: InitArm = arm) -> float:
            mla = convert_to_deployable_mla(teacher, kv_rank, rope_dims, selection, moments, method=arm.method)
            info = deploy_info(mla)
            value = perplexity(mla, select).perplexity
            if arm.label not in best or value < best[arm.label][0]:  # kept so the first seed need not convert again
                best[arm.label] = (value, mla)
            rope.add(arm=arm.label, selection=selection, **{"pairs kept": str(info["rope_pairs"]), "validation perplexity": value,
                     "rope key energy kept": sum(info["rope_key_energy_kept"]) / len(info["rope_key_energy_kept"])})
            return value
        chosen[arm.label] = select_on_validation(arm.selections, score, higher_is_better=False, param="rope selection").chosen

    # 2. the invariants, on CARE's deployable model before healing
    model = best[CARE][1]
    before_first = perplexity(model, evals).perplexity
    ppl.add(model=f"deployable CARE ({chosen[CARE]} rope), before healing", kv_saving=saving, perplexity=before_first, vs_original=before_first / base)
    kv = report.table("kv cache bytes per token (measured from cache tensors)", ["model", "measured", "expected", "saving"])
    _invariants(report, model, teacher, tokenizer, evals, ppl, kv, base, before_first, kv_width, sz)

    # 3. each arm's healing learning rate, chosen on calibration-split text (first seed)
    say("deploy report: choosing each arm's healing learning rate on calibration data")
    lr_table = report.table("healing learning rate (validation = calibration-split windows, first seed)", ["arm", "lr", "validation perplexity"])
    lrs: dict[str, float] = {}
    healed: dict[tuple[str, float], tuple[torch.nn.Module, list[float], float]] = {}  # the first seed's run at the chosen lr is reused
    for arm in ARMS:
        def heal_score(lr: float, arm: InitArm = arm) -> float:
            student = copy.deepcopy(best[arm.label][1])
            result = heal(student, teacher, train, replace(sz.heal, lr=lr, seed=seeds[0]), trainable=mla_parameters)
            value = perplexity(student, select).perplexity
            lr_table.add(arm=arm.label, lr=lr, **{"validation perplexity": value})
            if not any(k[0] == arm.label and healed[k][2] <= value for k in healed):
                for k in [k for k in healed if k[0] == arm.label]:
                    del healed[k]
                healed[arm.label, lr] = (student, result.losses, value)
            return value
        selection = select_on_validation(sz.lr_grid, heal_score, higher_is_better=False, param="lr")
        lrs[arm.label] = selection.chosen
        report.record_arm(arm.label, selection, budget={"heal_steps": sz.heal.steps, "heal_tokens": sz.heal.steps * sz.heal.batch_size * sz.heal_len,
                                                        "cache_numbers_per_token_layer": 2 * kv_rank + rope_dims})
    report.check_budgets_matched(["heal_steps", "heal_tokens", "cache_numbers_per_token_layer"])

    # 4. every arm over calibration seeds: same healing budget, held-out perplexity before and after
    say("deploy report: healing every arm over calibration seeds")
    runs = report.table("healing per seed (held-out perplexity)", ["seed", "arm", "rope", "lr", "before", "after", "after / before"])
    before: dict[tuple[str, int], float] = {}
    after: dict[tuple[str, int], float] = {}
    curves: dict[str, list[float]] = {}
    for s in seeds:
        seed_moments = moments if s == seeds[0] else kv_input_moments(teacher, calibration_windows(calib_pool, sz.calib_samples, s))
        for arm in ARMS:
            if s == seeds[0]:  # the same init, lr and seed as the validation run at the chosen lr: that run is this one
                before[arm.label, s] = perplexity(best[arm.label][1], evals).perplexity
                student, curves[arm.label], _ = healed.pop((arm.label, lrs[arm.label]))
            else:
                student = convert_to_deployable_mla(teacher, kv_rank, rope_dims, chosen[arm.label], seed_moments, method=arm.method)
                before[arm.label, s] = perplexity(student, evals).perplexity
                heal(student, teacher, train, replace(sz.heal, lr=lrs[arm.label], seed=s), trainable=mla_parameters)
            after[arm.label, s] = perplexity(student, evals).perplexity
            runs.add(seed=s, arm=arm.label, rope=chosen[arm.label], lr=lrs[arm.label], before=before[arm.label, s], after=after[arm.label, s],
                     **{"after / before": after[arm.label, s] / before[arm.label, s]})
            say(f"  seed {s} {arm.label:14s} perplexity {before[arm.label, s]:9.2f} -> {after[arm.label, s]:8.2f}")
            del student
    for b in BASELINES:
        report.measure_paired(f"care_heals_better_than_{_slug(b)}", [math.log(after[CARE, s]) for s in seeds], [math.log(after[b, s]) for s in seeds])
    report.measure("healing_lowers_perplexity", [after[CARE, s] / before[CARE, s] for s in seeds])
    for arm in ARMS:
        mean_after = sum(after[arm.label, s] for s in seeds) / len(seeds)
        ppl.add(model=f"deployable {arm.label}, after {sz.heal.steps} healing steps (mean of {len(seeds)} seeds)", kv_saving=saving,
                perplexity=mean_after, vs_original=mean_after / base)
    report.plots["healing_loss"] = _loss_plot(curves)
    report.note(
        f"Healing: {sz.heal.steps} steps x {sz.heal.batch_size} windows x {sz.heal_len} tokens per arm and seed, AdamW (warmup + cosine), "
        f"learning rate per arm from {list(sz.lr_grid)} on calibration-split validation; CE + {sz.heal.beta} tau^2 KL at tau {sz.heal.tau}, "
        "the original model as teacher; only the MLA parameters train (kv_a_proj, k_up, v_up, q_rope_proj)."
    )
    report.note(
        "MHA2MLA-style is MHA2MLA's partial-RoPE recipe (pairs by query-key 2-norm contribution) with an unwhitened SVD of K_nope and V "
        "as separate latents of the same total width: MHA2MLA's joint latent (one down-projection shared by K and V) does not fit the "
        "block-diagonal MLAAttention used here. If its pairs equal Palu's chosen pairs the two arms are the same model."
    )
    report.note("The original SmolLM2 is the Q4_1 GGUF dequantised to fp32 (a 4-bit model). Earlier versions of this report chose the "
                "RoPE pairs on the evaluation split; they are now chosen on calibration-split text.")
    return report.finish()


def _invariants(report: Report, model, teacher, tokenizer, evals: torch.Tensor, ppl, kv, base: float, before: float, kv_width: int, sz: Settings) -> None:
    cfg = teacher.config
    gqa_bytes = measured_kv_bytes_per_token(teacher)
    mla_bytes = measured_kv_bytes_per_token(model)
    expected = expected_cache_bytes_per_token(model)
    kv.add(model="original GQA", measured=gqa_bytes, expected=2 * cfg.num_hidden_layers * kv_width * 4, saving=0.0)
    kv.add(model="deployable MLA", measured=mla_bytes, expected=expected, saving=1 - mla_bytes / gqa_bytes)
    report.measure("cache_bytes_equal_expected", abs(mla_bytes - expected))
    report.measure("kv_saving_50pct", 1 - mla_bytes / gqa_bytes)
    probe = evals[:2, : min(64, sz.eval_len)]
    with torch.no_grad():
        scale = float(model(input_ids=probe).logits.abs().max())
    report.measure("absorbed_equals_expanded", absorbed_vs_expanded(model, probe) / scale)
    report.measure("generate_equals_no_cache", generation_mismatches(model, evals[:1, :16], 12))
    with tempfile.TemporaryDirectory() as tmp:
        export_deepseek_v3(model, f"{tmp}/export", tokenizer)
        exported = load_deepseek_v3(f"{tmp}/export")
        with torch.no_grad():
            logit_gap = float((exported(input_ids=probe).logits - model(input_ids=probe).logits).abs().max())
        exp_ppl = perplexity(exported, evals).perplexity
        exp_bytes = measured_kv_bytes_per_token(exported)
    kv.add(model="exported DeepseekV3ForCausalLM", measured=exp_bytes, expected=expected, saving=1 - exp_bytes / gqa_bytes)
    ppl.add(model="exported DeepSeek-V3 checkpoint (stock transformers)", kv_saving=1 - exp_bytes / gqa_bytes, perplexity=exp_ppl, vs_original=exp_ppl / base)
    report.measure("export_perplexity_gap", abs(exp_ppl / before - 1))
    report.note(f"Exported checkpoint: max |logit| gap vs our module {logit_gap:.2e}; perplexity {exp_ppl:.4f} vs {before:.4f}.")


def _loss_plot(curves: dict[str, list[float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for label, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, label=label)
    ax.set_xlabel("healing step")
    ax.set_ylabel("CE + beta tau^2 KL")
    ax.set_title("MLA healing loss (first seed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
