"""The catalogue: one `MethodSpec` per method card, the single record everything else reads.

`rankwise list`, `rankwise repro SLUG[:EXPERIMENT]`, `rankwise demo`, the CLI's method commands, the folder formats
`load_model` reloads, the README's method table and the test matrix are all built from `METHODS` below; nothing is
found by scanning modules or by naming conventions.

A method's status is computed from what exists, never typed:
  planned      its API entry points or its `main` experiment do not resolve, or no test is marked for it;
  implemented  its entry points resolve, its `main` experiment resolves and tests carry `pytest.mark.method(slug)`;
  reproduced   implemented, the `main` experiment's committed `full` report (protocol 2) has at least one paper
               claim and every paper claim PASSes, and every other experiment's full report has none that does not.

This module imports nothing of rankwise but its errors: targets are "module:attribute" strings resolved on use, so
the registry can be read from any layer without pulling method code in. CONTRIBUTING.md says how to add an entry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rankwise.errors import RankwiseError, UnknownNameError
from rankwise.targets import defines, resolve, resolves  # noqa: F401  (resolves: re-exported for tests)

# A family is the package a method's code lives in (theory methods live in reproductions only).
FAMILIES = {
    "adapters": "rankwise.adapters",
    "compress": "rankwise.compress",
    "quant": "rankwise.quant",
    "optim": "rankwise.optim",
    "nn": "rankwise.nn",
    "algorithms": "rankwise.algorithms",
    "recipes": "rankwise.recipes",  # training procedures that are not optimizers or layers (DFA, TraDy, WASI, ...)
    "apps": "rankwise.apps",  # domain methods: apps/<domain>/ (RL, graphs, vision, embodied control)
    "theory": "rankwise.repro",
}
STATUSES = ("planned", "implemented", "reproduced")
MAIN = "main"


@dataclass(frozen=True)
class Experiment:
    """One reproduction experiment: `run(size, seed) -> Report`, its report under `docs/results/<slug>[/<name>]/`.

    `threads` is the intra-op thread count the runner sets while it runs (None: leave torch's default, one per core);
    a user's `rankwise --threads N` overrides it. Small-matmul experiments use 1: a second thread mostly spin-waits.
    """

    name: str
    run: str  # "module:function"
    summary: str
    threads: int | None = 1

    def results_dir(self, slug: str) -> Path:
        base = Path("docs") / "results" / slug
        return base if self.name == MAIN else base / self.name


@dataclass(frozen=True)
class Command:
    """A CLI command a method contributes: `name` is its words ("place", "convert mla"); `module` has `register`."""

    name: str
    module: str


@dataclass(frozen=True)
class FolderFormat:
    """A model-folder format a method writes (config.json's "rankwise_format") and the loader that reads it back."""

    name: str
    loader: str  # "module:function", (path) -> (model, tokenizer)


@dataclass(frozen=True)
class MethodSpec:
    slug: str  # = the method card's file name
    title: str  # the paper's title
    family: str
    api: tuple[str, ...] = ()  # "module:attribute" of the public API
    experiments: tuple[Experiment, ...] = ()  # the first is `main`
    demo: str | None = None  # "module:function" taking a DemoContext
    commands: tuple[Command, ...] = ()
    folder_formats: tuple[FolderFormat, ...] = ()
    docs: str | None = None  # the method page, relative to the checkout

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise RankwiseError(f"{self.slug}: family {self.family!r} not in {sorted(FAMILIES)}")
        names = [e.name for e in self.experiments]
        if names and names[0] != MAIN:
            raise RankwiseError(f"{self.slug}: the first experiment must be {MAIN!r}, got {names}")
        if len(set(names)) != len(names):
            raise RankwiseError(f"{self.slug}: duplicate experiment names {names}")

    # -- what exists ----------------------------------------------------------------------------------------------
    def experiment(self, name: str = MAIN) -> Experiment:
        for e in self.experiments:
            if e.name == name:
                return e
        known = ", ".join(e.name for e in self.experiments) or "none yet"
        raise UnknownNameError(f"{self.slug} has no experiment {name!r} (experiments: {known})")

    def has_api(self) -> bool:
        return bool(self.api) and all(defines(e) for e in self.api)

    def has_reproduction(self) -> bool:
        return bool(self.experiments) and all(defines(e.run) for e in self.experiments)

    def has_tests(self) -> bool:
        marked = marked_test_slugs()
        return True if marked is None else self.slug in marked  # installed without tests/: trust the API

    # -- what was measured ----------------------------------------------------------------------------------------
    def report(self, experiment: str = MAIN) -> dict | None:
        """The committed report of an experiment (None if absent or unreadable)."""
        root = repo_root()
        if root is None:
            return None
        path = root / self.experiment(experiment).results_dir(self.slug) / "report.json"
        try:
            return json.loads(path.read_text()) if path.is_file() else None
        except (OSError, json.JSONDecodeError):
            return None

    @property
    def status(self) -> str:
        if not (self.has_api() and self.has_reproduction() and self.has_tests()):
            return "planned"
        main, *extras = [self.report(e.name) for e in self.experiments]
        # An extra experiment (e.g. care-mla's deploy) may hold only checks; any paper claim it has must PASS too.
        if main is not None and report_reproduces(main) and all(
                r is not None and report_reproduces(r, require_paper_claim=False) for r in extras):
            return "reproduced"
        return "implemented"

    def claims_summary(self, experiment: str = MAIN) -> str:
        """Paper-claim verdicts of the committed full report, e.g. "3/4 paper claims PASS, 1 INCONCLUSIVE"."""
        report = self.report(experiment)
        if not report or report.get("size") != "full":
            return ""
        if report.get("protocol", 1) < 2:  # written before claims had kinds: none of them is evidence yet
            claims = report.get("claims", [])
            return f"legacy report: {sum(bool(c.get('passed')) for c in claims)}/{len(claims)} unclassified claims held"
        paper = [c for c in report.get("claims", []) if c.get("kind") == "paper"]
        counts = {v: sum(c.get("verdict") == v for c in paper) for v in ("PASS", "FAIL", "INCONCLUSIVE")}
        text = f"{counts['PASS']}/{len(paper)} paper claims PASS"
        rest = [f"{n} {v}" for v, n in counts.items() if v != "PASS" and n]
        return text + (f" ({', '.join(rest)})" if rest else "")


def report_reproduces(report: dict, require_paper_claim: bool = True) -> bool:
    """A committed report supports *reproduced*: full size, protocol 2, >= 1 paper claim, every paper claim PASS."""
    if report.get("size") != "full" or report.get("protocol", 1) < 2:
        return False
    paper = [c for c in report.get("claims", []) if c.get("kind") == "paper"]
    return (bool(paper) or not require_paper_claim) and all(c.get("verdict") == "PASS" for c in paper)


@lru_cache(maxsize=1)
def repo_root() -> Path | None:
    """The source checkout holding this package (src layout), if there is one."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "rankwise").is_dir():
            return parent
    return None


_MARKER = re.compile(r"""mark\.method\(\s*((?:["'][a-z0-9-]+["']\s*,?\s*)+)\)""")


@lru_cache(maxsize=1)
def marked_test_slugs() -> frozenset[str] | None:
    """Slugs named by `pytest.mark.method(...)` in the checkout's tests (None when there is no tests/ folder).

    Read from the source text so that `rankwise list` need not import pytest; tests/conftest.py checks at collection
    that every marker names a registered slug.
    """
    root = repo_root()
    if root is None or not (root / "tests").is_dir():
        return None
    found: set[str] = set()
    for path in (root / "tests").rglob("*.py"):
        for group in _MARKER.findall(path.read_text(encoding="utf-8", errors="replace")):
            found.update(re.findall(r"""["']([a-z0-9-]+)["']""", group))
    return frozenset(found)


def _repro(slug: str, name: str = MAIN, summary: str = "", threads: int | None = 1, module: str | None = None) -> Experiment:
    return Experiment(name, f"rankwise.repro.{slug.replace('-', '_')}.{module or name}:run", summary, threads)


def _m(slug: str, title: str, family: str, **fields: Any) -> MethodSpec:
    return MethodSpec(slug, title, family, **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


FINETUNE = Command("finetune", "rankwise.commands.finetune")

METHODS: tuple[MethodSpec, ...] = (
    _m("care-mla", "CARE: Covariance-Aware and Rank-Enhanced Decomposition for Enabling Multi-Head Latent Attention", "compress",
       api=["rankwise.compress.mla:convert_to_mla", "rankwise.compress.mla:decompose_kv", "rankwise.compress.mla:allocate_ranks",
            "rankwise.compress.mla:save_mla", "rankwise.compress.mla:load_mla", "rankwise.core.linalg:whitened_low_rank",
            "rankwise.compress.mla_deploy:convert_to_deployable_mla", "rankwise.compress.mla_deploy:export_deepseek_v3",
            "rankwise.compress.mla:text_calibration_windows"],
       experiments=[_repro("care-mla", summary="one-shot GQA->MLA on SmolLM2: CARE vs plain SVD and SVD-LLM, uniform vs adjusted ranks over calibration seeds, perplexity and next-sentence accuracy", threads=None),
                    _repro("care-mla", "deploy", "latent-only KV cache, absorbed decoding, DeepSeek-V3 export; CARE vs Palu and MHA2MLA-style inits after equal healing", threads=None),
                    _repro("care-mla", name="domain", summary="calibration domain: calibrate on wiki or Python-reference prose, evaluate on the other; the mix, in-domain amounts, covariance spectrum, near-full rank", module="domain")],
       demo="rankwise.demos.care_mla:headline",
       commands=[Command("convert mla", "rankwise.commands.convert_mla")],
       folder_formats=[FolderFormat("mla-oneshot", "rankwise.compress.mla.io:load_mla")],
       docs="docs/methods/care-mla.md"),
    _m("coa-lora", "On-the-Fly Adaptation to Quantization: Configuration-Aware LoRA for Efficient Fine-Tuning of Quantized LLMs", "adapters",
       api=["rankwise.adapters.coa_lora:CoaLoraConfig", "rankwise.adapters.coa_lora:CoaLoraAdapter",
            "rankwise.recipes.coa_lora:QuantizedBank", "rankwise.recipes.coa_lora:ConfigurationSearch",
            "rankwise.algorithms.config_search:propose_configurations", "rankwise.algorithms.config_search:segmented_pareto",
            "rankwise.training.coa_lora:coa_lora_procedure"],
       experiments=[_repro("coa-lora", summary="MiniLM top layers NF-quantized per layer, wiki-topics on held-out configurations: CoA-LoRA vs per-configuration LoRA, Shared-LoRA and no search")],
       commands=[FINETUNE], docs="docs/methods/coa-lora.md"),
    _m("codequant", "CodeQuant: Unified Clustering and Quantization for Enhanced Outlier Smoothing in Low-Precision Mixture-of-Experts", "compress"),
    _m("consistent-lra", "Consistent Low-Rank Approximation", "algorithms",
       api=["rankwise.algorithms.consistent_lra:LazyAdditiveLRA", "rankwise.algorithms.consistent_lra:RidgeLeverageLRA",
            "rankwise.algorithms.consistent_lra:VerifiedMultiplicativeLRA", "rankwise.algorithms.consistent_lra:RecomputeSVD",
            "rankwise.algorithms.consistent_lra:FrequentDirectionsLRA", "rankwise.algorithms.consistent_lra:SubspaceStream",
            "rankwise.algorithms.consistent_lra:prefix_optimal_cost", "rankwise.algorithms.consistent_lra:growth_exponent",
            "rankwise.algorithms.consistent_lra:adversarial_alternation", "rankwise.algorithms.consistent_lra:lower_bound_phases"],
       experiments=[_repro("consistent-lra", summary="recourse growth and per-step guarantee of lazy-additive, ridge-leverage and verify-then-recompute streams vs recompute-SVD and Frequent Directions on adversarial, digits and camera rows")],
       docs="docs/methods/consistent-lra.md"),
    _m("dfa-feedback-matching", "Enabling Fine-Tuning of Direct Feedback Alignment via Feedback-Weight Matching", "recipes"),
    _m("diff-interpretation-tuning", "Learning to Interpret Weight Differences in Language Models", "recipes"),
    _m("diffgda", "Learning Structure-Semantic Evolution Trajectories for Graph Domain Adaptation", "apps"),
    _m("emac-autta", "Exposing Mixture and Annotating Confusion for Active Universal Test-Time Adaptation", "apps"),
    _m("escape-directions", "Saddle-To-Saddle Dynamics in Deep ReLU Networks: Low-Rank Bias in the First Saddle Escape", "algorithms",
       api=["rankwise.algorithms.escape_directions:optimal_escape_direction", "rankwise.algorithms.escape_directions:train_from_init",
            "rankwise.algorithms.escape_directions:local_loss", "rankwise.algorithms.escape_directions:layer_ratios",
            "rankwise.algorithms.escape_directions:depth_gap", "rankwise.algorithms.escape_directions:norm_growth"],
       experiments=[_repro("escape-directions", summary="digits, bias-free ReLU MLPs: depth gap s1/s2 >= l^(1/4) in deep layers at the escape of small-init GD vs default init; rank-1 optimal escape direction; the card's Example 1")],
       docs="docs/methods/escape-directions.md"),
    _m("frequency-representation-learning", "Breaking Scale Anchoring: Frequency Representation Learning for Accurate High-Resolution Inference from Low-Resolution Training", "nn"),
    _m("guardspace", "A Guardrail for Safety Preservation: When Safety-Sensitive Subspace Meets Harmful-Resistant Null-Space", "adapters",
       api=["rankwise.adapters.guardspace:GuardSpaceConfig", "rankwise.adapters.guardspace:GuardSpaceAdapter",
            "rankwise.adapters.guardspace_split:guarded_split", "rankwise.adapters.safe_projection:safe_project"],
       experiments=[_repro("guardspace", summary="SmolLM2 fine-tuned on a task with overwrite data: protected and held-out prompt drift and task accuracy vs LoRA, a Safe-LoRA-like post-hoc projection and same-rank unrelated-theme / random projector controls, each arm's lr chosen on validation, 3 seeds")],
       commands=[FINETUNE], docs="docs/methods/guardspace.md"),
    _m("hybrid-online-learning", "Oracle-efficient Hybrid Learning with Constrained Adversaries", "algorithms",
       api=["rankwise.algorithms.hybrid_online:HybridFTRL", "rankwise.algorithms.hybrid_online:FollowTheLeader",
            "rankwise.algorithms.hybrid_online:FollowPerturbedLeader", "rankwise.algorithms.hybrid_online:StumpOracle",
            "rankwise.algorithms.hybrid_online:FiniteClassOracle", "rankwise.algorithms.hybrid_online:SklearnERMOracle",
            "rankwise.algorithms.hybrid_online:play", "rankwise.algorithms.hybrid_online:regret",
            "rankwise.algorithms.hybrid_online:matrix_game", "rankwise.algorithms.hybrid_online:learn_game"],
       experiments=[_repro("hybrid-online-learning", summary="regret against T of the oracle-efficient FTRL vs FTL and FTPL under five constrained adversaries (thresholds, intervals, breast-cancer stumps with exact and scikit-learn oracles), 6 seeds; the game corollary vs linprog")],
       docs="docs/methods/hybrid-online-learning.md"),
    _m("ivq-concept-bottleneck", "Escaping Low-Rank Traps: Interpretable Visual Concept Learning via Implicit Vector Quantization", "nn"),
    _m("la-lora", "Rethinking LoRA for Privacy-Preserving Federated Learning in Large Models", "adapters",
       api=["rankwise.adapters.la_lora:local_round", "rankwise.adapters.la_lora:LocalDPConfig",
            "rankwise.adapters.la_lora:active_factors", "rankwise.adapters.la_lora:binomial_smooth",
            "rankwise.adapters.dp_gradients:per_sample_gradients", "rankwise.adapters.dp_gradients:noise_for_epsilon",
            "rankwise.training.federated_job:run_federated", "rankwise.training.federated:FederatedConfig",
            "rankwise.training.partition:dirichlet_partition"],
       experiments=[_repro("la-lora", summary="DP federated LoRA on MiniLM wiki topics (Flower, Dirichlet clients): LA-LoRA vs DP-LoRA, FFA-LoRA, RoLoRA at epsilon 1 and 8")],
       commands=[FINETUNE], docs="docs/methods/la-lora.md"),
    _m("lmao", "Three Forward, One Backward: Memory-Efficient Full-Rank Fine-Tuning of Large Models via Extra Forward Passes", "optim",
       api=["rankwise.optim.zeroth_order:SPSA", "rankwise.optim.zeroth_order:mezo_step", "rankwise.optim.lmao:LmaoConfig",
            "rankwise.optim.lmao:select_base_tensors", "rankwise.training.lmao:LmaoProcedure", "rankwise.training.lmao:lmao_procedure"],
       experiments=[_repro("lmao", summary="MiniLM few-shot (k=16) wiki-topics, top-2-layer variant, 120 steps: LMAO vs first-order LoRA, MeZO and full FT, each arm's rates on validation, 5 seeds")],
       commands=[FINETUNE], docs="docs/methods/lmao.md"),
    _m("lora-pre", "Taming Momentum: Rethinking Optimizer States Through Low-Rank Approximation", "optim",
       api=["rankwise.optim:LoRAPre", "rankwise.optim:LoRAPreMuon", "rankwise.optim:low_rank_param_groups",
            "rankwise.optim:galore_adamw", "rankwise.optim:optimizer_state_bytes"],
       experiments=[_repro("lora-pre", summary="momentum tracking (3 streams) and byte-level Llama pretraining, 2,000 steps: AdamW, GaLore, LoRA-Pre from its zero and SVD starts, own lr grids, 3 seeds"),
                    _repro("lora-pre", name="finetune", module="finetune_exp", summary="MiniLM top-layer fine-tuning on wiki-topics, 1,000 steps: LoRA-Pre vs LoRA (same rank) and AdamW, own lr grids, shared head lr, 3 seeds")],
       demo="rankwise.demos.lora_pre:headline", commands=[FINETUNE], docs="docs/methods/lora-pre.md"),
    _m("lorax", "Low rank adaptation of chemical foundation models generates effective odorant representations", "adapters"),
    _m("lorsa", "Towards Understanding the Nature of Attention with Low-Rank Sparse Decomposition", "nn",
       api=["rankwise.nn.lorsa:Lorsa", "rankwise.nn.lorsa:LorsaConfig", "rankwise.nn.lorsa:Rope",
            "rankwise.nn.lorsa:lorsa_from_attention", "rankwise.nn.lorsa:CausalSelfAttention", "rankwise.nn.lorsa:TopKSAE",
            "rankwise.nn.lorsa:fit", "rankwise.nn.lorsa:fvu", "rankwise.nn.lorsa:top_activating_contexts",
            "rankwise.nn.lorsa:induction_score", "rankwise.nn.lorsa:save_lorsa", "rankwise.nn.lorsa:load_lorsa"],
       experiments=[_repro("lorsa", summary="toy transformer with four planted mechanisms in two layer-2 heads: Lorsa's induction heads, per-mechanism purity vs the MHA heads, FVU vs a Top-K SAE at equal K"),
                    _repro("lorsa", "smollm2", "SmolLM2 middle layer: held-out FVU against K, Lorsa vs a Top-K SAE of equal width, 3 seeds")],
       commands=[Command("lorsa top", "rankwise.commands.lorsa_top")], docs="docs/methods/lorsa.md"),
    _m("loss-curve-collapse", "Scaling with Collapse: Efficient and Predictable Training of LLM Families", "recipes",
       api=["rankwise.recipes.loss_curve_collapse:normalise", "rankwise.recipes.loss_curve_collapse:Curve",
            "rankwise.recipes.loss_curve_collapse:timescale", "rankwise.recipes.loss_curve_collapse:timescale_adamw",
            "rankwise.recipes.loss_curve_collapse:fit_divisor", "rankwise.recipes.loss_curve_collapse:residual",
            "rankwise.recipes.loss_curve_collapse:collapse_spread", "rankwise.data.compact_vocab:byte_tokenizer"],
       experiments=[_repro("loss-curve-collapse", summary="byte-level muP LM family: collapse with tau vs lambda fixed, "
                           "fault detection from the residual, early stopping in an LR sweep")],
       docs="docs/methods/loss-curve-collapse.md"),
    _m("lowprec-flash-attention", "Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention", "recipes"),
    _m("lrnn", "Deep Learning with Learnable Product-Structured Activations", "nn",
       api=["rankwise.nn.lrnn:LRNN", "rankwise.nn.lrnn:LowRankSeparatedLayer", "rankwise.nn.lrnn:UnivariateComponents",
            "rankwise.nn.lrnn:lrnn_parameter_count", "rankwise.nn.lrnn:Siren", "rankwise.nn.lrnn:radon_transform"],
       experiments=[_repro("lrnn", summary="camera 64x64 INR: 2-layer LRNN vs SIREN at matched parameters, PSNR over 3 seeds"),
                    _repro("lrnn", "multiplicative", "prod_i sin(pi x_i) on [-1,1]^6: shallow LRNN vs tanh MLP at equal parameters"),
                    _repro("lrnn", "audio", "synthetic 1 s, 8 kHz signal: LRNN vs SIREN, MSE and per-band spectral error"),
                    _repro("lrnn", "ct", "sparse-view CT of Shepp-Logan through a differentiable Radon: LRNN vs SIREN vs FBP")],
       docs="docs/methods/lrnn.md"),
    _m("martingale-posterior-uq", "Frozen Priors, Fluid Forecasts: Prequential Uncertainty for Low-Data Deployment with Pretrained Generative Models", "algorithms",
       api=["rankwise.algorithms.martingale_posterior:martingale_posterior", "rankwise.algorithms.martingale_posterior:posterior_draws",
            "rankwise.algorithms.martingale_posterior:forward_resample", "rankwise.algorithms.martingale_posterior:dirichlet_shortcut",
            "rankwise.algorithms.martingale_posterior:estimate_alpha", "rankwise.algorithms.martingale_posterior:PoolGenerator",
            "rankwise.algorithms.martingale_posterior:bootstrap_interval", "rankwise.algorithms.martingale_posterior:bayesian_bootstrap_interval",
            "rankwise.algorithms.martingale_posterior:jackknife_interval", "rankwise.algorithms.martingale_posterior:drift_bound"],
       experiments=[_repro("martingale-posterior-uq", summary="synthetic two-moons deployment at two mismatch levels: coverage of 90% intervals (MP forward, Dirichlet shortcut, bootstrap, Bayesian bootstrap, jackknife), 1,200 repetitions per n"),
                    _repro("martingale-posterior-uq", "llm", "SmolLM2 as the frozen generator, per-token NLL: coverage at n = 5..50, 1,200 repetitions per n")],
       docs="docs/methods/martingale-posterior-uq.md"),
    _m("metavla", "MetaVLA: Unified Meta Co-Training for Efficient Embodied Adaptation", "apps"),
    _m("microscaling-ue5m3", "Is Finer Better? The Limits of Microscaling Formats in Large Language Models", "quant",
       api=["rankwise.quant.formats:FloatFormat", "rankwise.quant.block:quantize", "rankwise.quant.fake_quant:quantize_linears_",
            "rankwise.quant.storage:save_quantized", "rankwise.quant.error_model:gaussian_terms"],
       experiments=[_repro("microscaling-ue5m3", summary="block-size anomaly of UE4M3 scales; UE5M3 without a global scale; torchao parity")],
       demo="rankwise.demos.microscaling_ue5m3:headline",
       commands=[Command("quantize", "rankwise.commands.quantize")],
       folder_formats=[FolderFormat("microscaling", "rankwise.quant.storage:load_quantized")],
       docs="docs/methods/microscaling-ue5m3.md"),
    _m("mixture-of-memories", "MoM: Linear Sequence Modeling with Mixture-of-Memories", "nn",
       api=["rankwise.nn.mixture_of_memories:MixtureOfMemories", "rankwise.nn.mixture_of_memories:LinearAttention",
            "rankwise.nn.mixture_of_memories:load_balancing_loss", "rankwise.nn.mixture_of_memories:TopKRouter",
            "rankwise.nn.mixture_of_memories:CausalSoftmaxAttention",
            "rankwise.nn.mixture_of_memories:linear_attention_chunked",
            "rankwise.nn.mixture_of_memories:linear_attention_recurrent"],
       experiments=[_repro("mixture-of-memories", summary="MQAR accuracy against the number of kv pairs: MoM vs single-memory, expanded single-memory and softmax attention, 3 seeds")],
       docs="docs/methods/mixture-of-memories.md"),
    _m("multitask-lora-trigger", "JailbreakLoRA: Your Downloaded LoRA from Sharing Platforms might be Unsafe", "adapters"),
    _m("palc", "PALC: Preference Alignment via Logit Calibration", "recipes"),
    _m("peso", "Continual Low-Rank Adapters for LLM-based Generative Recommender Systems", "adapters",
       api=["rankwise.adapters.peso:ProximalRegularizer", "rankwise.adapters.peso:inherit", "rankwise.training.peso:peso_procedure",
            "rankwise.data.ratings:load_movielens"],
       experiments=[_repro("peso", summary="MovieLens time blocks, item-ID Llama: PESO vs single evolving, cumulative and L2-proximal LoRA, each tuned on validation users")],
       commands=[FINETUNE], docs="docs/methods/peso.md"),
    _m("pft-fer", "Personalized Feature Translation for Expression Recognition: An Efficient Source-Free Domain Adaptation Method", "apps"),
    _m("pica", "PiCa: Parameter-Efficient Fine-Tuning with Column Space Projection", "adapters",
       api=["rankwise.adapters:PicaConfig", "rankwise.adapters.svft:SvftConfig", "rankwise.adapters:add_adapter", "rankwise.training:train"],
       experiments=[_repro("pica", summary="MiniLM topic classification, each arm tuned on validation: PiCa vs LoRA and SVFT (PiSSA extra)")],
       demo="rankwise.demos.pica:headline", commands=[FINETUNE], docs="docs/methods/pica.md"),
    _m("plop", "PLoP: Precise LoRA Placement for Efficient Finetuning of Large Models", "adapters",
       api=["rankwise.adapters.plop:nfn_scores", "rankwise.adapters.plop:plop_targets"],
       experiments=[_repro("plop", summary="NFN ranking stability; PLoP vs PLoP^-1 and attention/MLP placements, SmolLM2 top-layer topic fine-tuning")],
       commands=[Command("place", "rankwise.commands.place")], docs="docs/methods/plop.md"),
    _m("portable-adapter", "CAR-LoRA: Training Compression-Aware and Robust LoRA Adapters for Evolving LLMs", "recipes",
       api=["rankwise.recipes.car_lora:CompressedBase", "rankwise.quant.compression_ops:parse_operators",
            "rankwise.training.car_lora:CarLoraProcedure", "rankwise.quant.codebook:quantize_codebook",
            "rankwise.quant.codebook:CodebookRecipe"],
       experiments=[_repro("portable-adapter", summary="SmolLM2 top blocks on a wiki topic: one LoRA over resampled int8/nf4/fp4/prune/skip bases vs per-operator adapters and an equally long FP LoRA, on compressed, held-out (int3, int4) and drifted bases, 5 seeds")],
       commands=[FINETUNE], docs="docs/methods/portable-adapter.md"),
    _m("quantized-relu-training", "Tractability via Low Dimensionality: The Parameterized Complexity of Training Quantized Neural Networks", "algorithms",
       api=["rankwise.algorithms.quantized_relu:layer_dp", "rankwise.algorithms.quantized_relu:brute_force",
            "rankwise.algorithms.quantized_relu:decide", "rankwise.algorithms.quantized_relu:count_errors",
            "rankwise.algorithms.quantized_relu:QuantizedArchitecture", "rankwise.algorithms.quantized_relu:planted_instance"],
       experiments=[_repro("quantized-relu-training", summary="exact layer DP = brute force on random Z_d instances; solver cost per parameter (n, depth, width, alpha) against brute force")],
       docs="docs/methods/quantized-relu-training.md"),
    _m("sample-weight-decay", "The Rank and Gradient Lost in Non-stationarity: Sample Weight Decay for Mitigating Plasticity Loss in Reinforcement Learning", "apps"),
    _m("task-arithmetic-fairness", "On Fairness of Task Arithmetic: The Role of Task Vectors", "recipes"),
    _m("trady", "Study of Training Dynamics for Memory-Constrained Fine-Tuning", "recipes"),
    _m("tubal-rank-recovery", "The Power of Small Initialization in Noisy Low-Tubal-Rank Tensor Recovery", "algorithms",
       api=["rankwise.algorithms.tubal:t_product", "rankwise.algorithms.tubal:t_transpose", "rankwise.algorithms.tubal:t_svd",
            "rankwise.algorithms.tubal:tubal_rank", "rankwise.algorithms.tubal:t_spectral_norm", "rankwise.algorithms.tubal:block_circulant",
            "rankwise.algorithms.tubal:GaussianMeasurements", "rankwise.algorithms.tubal:small_init", "rankwise.algorithms.tubal:spectral_init",
            "rankwise.algorithms.tubal:factorized_gd", "rankwise.algorithms.tubal:low_tubal_rank_psd"],
       experiments=[_repro("tubal-rank-recovery", summary="FGD recovery error against over-estimated tubal rank R: small init + early stopping vs spectral init, 6 seeds")],
       docs="docs/methods/tubal-rank-recovery.md"),
    _m("wasi", "Efficient Resource-Constrained Training of Transformers via Subspace Optimization", "recipes"),
)

BY_SLUG = {m.slug: m for m in METHODS}

# Commands every install has, whatever its methods; method commands come from the records above.
GENERAL_COMMANDS: tuple[Command, ...] = (
    Command("list", "rankwise.commands.list"),
    Command("repro", "rankwise.commands.repro"),
    Command("demo", "rankwise.commands.demo"),
    Command("eval", "rankwise.commands.eval"),
    Command("cache", "rankwise.commands.cache"),
    Command("info", "rankwise.commands.info"),
)
COMMAND_GROUPS = {"convert": "convert a model (e.g. GQA attention to multi-head latent attention)",
                  "lorsa": "inspect a fitted low-rank sparse attention (Lorsa) replacement"}


def get_method(slug: str) -> MethodSpec:
    if slug not in BY_SLUG:
        raise UnknownNameError(f"unknown method {slug!r}; `rankwise list` shows the {len(METHODS)} known slugs")
    return BY_SLUG[slug]


def parse_target(target: str) -> tuple[MethodSpec, Experiment]:
    """"SLUG" or "SLUG:EXPERIMENT" -> (method, experiment)."""
    slug, _, name = target.partition(":")
    method = get_method(slug)
    if not method.experiments:
        raise RankwiseError(f"{slug} has no reproduction yet (status: {method.status})")
    return method, method.experiment(name or MAIN)


def methods_with_reproduction() -> list[MethodSpec]:
    return [m for m in METHODS if m.has_reproduction()]


def all_experiments() -> list[tuple[MethodSpec, Experiment]]:
    """Every registered experiment (the smoke test matrix)."""
    return [(m, e) for m in METHODS for e in m.experiments]


def all_commands() -> list[Command]:
    """The CLI's commands: the general ones, then each method's (a command shared by methods appears once)."""
    seen: dict[str, Command] = {c.name: c for c in GENERAL_COMMANDS}
    for m in METHODS:
        for c in m.commands:
            if seen.setdefault(c.name, c) != c:
                raise RankwiseError(f"command {c.name!r} is registered with two modules: {seen[c.name].module}, {c.module}")
    return list(seen.values())


def demo_headlines() -> list[tuple[MethodSpec, Callable]]:
    return [(m, resolve(m.demo)) for m in METHODS if m.demo]


def folder_loader(fmt: str) -> Callable:
    """The loader of a rankwise folder format (config.json's "rankwise_format")."""
    for m in METHODS:
        for f in m.folder_formats:
            if f.name == fmt:
                return resolve(f.loader)
    known = sorted(f.name for m in METHODS for f in m.folder_formats)
    raise UnknownNameError(f"rankwise format {fmt!r} is unknown to this version; known: {known}")


def markdown_table() -> str:
    """The README's method table, generated from the catalogue."""
    lines = ["| method | paper | family | status | full-run verdicts |", "|---|---|---|---|---|"]
    for m in METHODS:
        cells = []
        for e in m.experiments:
            summary = m.claims_summary(e.name)
            if summary:
                label = "" if e.name == MAIN else f"{e.name}: "
                cells.append(f"[{label}{summary}]({e.results_dir(m.slug).as_posix()}/report.md)")
        lines.append(f"| `{m.slug}` | {m.title} | {m.family} | {m.status} | {'; '.join(cells)} |")
    return "\n".join(lines)


README_START = "<!-- methods-table:start -->"
README_END = "<!-- methods-table:end -->"


def readme_with_table(readme: str) -> str:
    """`readme` with the text between the method-table markers replaced by the generated table."""
    head, sep1, rest = readme.partition(README_START)
    _, sep2, tail = rest.partition(README_END)
    if not (sep1 and sep2):
        raise UnknownNameError(f"README lacks the markers {README_START} ... {README_END}")
    return f"{head}{README_START}\n{markdown_table()}\n{README_END}{tail}"
