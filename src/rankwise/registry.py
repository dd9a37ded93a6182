"""The catalogue: one entry per method card. It drives `rankwise list`, the README's method table and the test matrix.

A method's status is computed from what exists, never typed:
  planned      its API entry points or its reproduction module do not exist yet;
  implemented  its entry points resolve, its reproduction module has `run`, and it has tests;
  reproduced   implemented, and `docs/results/<slug>/report.json` is a `full` run whose claims all pass.
To land a method: put its public API in `entry_points` ("module:attribute"), write `rankwise/repro/<slug_>.py`
with `run(size, seed) -> Report`, tests under `tests/` named `test_<slug_>*.py`, then run its full reproduction.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rankwise.errors import UnknownNameError

FAMILIES = ("adapters", "compress", "quant", "optim", "nn", "training", "algorithms", "theory")


@dataclass(frozen=True)
class Method:
    slug: str  # = the method card's file name
    title: str  # the paper's title
    family: str
    entry_points: tuple[str, ...] = ()  # "module:attribute" of the public API

    @property
    def module_name(self) -> str:
        return self.slug.replace("-", "_")

    @property
    def reproduction(self) -> str:
        return f"rankwise.repro.{self.module_name}"

    def has_reproduction(self) -> bool:
        return _resolves(f"{self.reproduction}:run")

    def has_api(self) -> bool:
        return bool(self.entry_points) and all(_resolves(e) for e in self.entry_points)

    def has_tests(self) -> bool:
        root = repo_root()
        if root is None:  # installed without the source tree: tests cannot be checked, trust the API
            return True
        return any((root / "tests").rglob(f"test_{self.module_name}*.py"))

    def report(self) -> dict | None:
        root = repo_root()
        path = root / "docs" / "results" / self.slug / "report.json" if root else None
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None

    @property
    def status(self) -> str:
        if not (self.has_api() and self.has_reproduction() and self.has_tests()):
            return "planned"
        report = self.report()
        if report and report.get("size") == "full" and report.get("claims") and report.get("passed"):
            return "reproduced"
        return "implemented"

    def claims_summary(self) -> str:
        report = self.report()
        if not report or report.get("size") != "full":
            return ""
        claims = report.get("claims", [])
        return f"{sum(c['passed'] for c in claims)}/{len(claims)} hold"


def _resolves(target: str) -> bool:
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return False
    return not attr or hasattr(mod, attr)


@lru_cache(maxsize=1)
def repo_root() -> Path | None:
    """The source checkout holding this package (src layout), if there is one."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "rankwise").is_dir():
            return parent
    return None


def M(slug: str, title: str, family: str, *entry_points: str) -> Method:
    if family not in FAMILIES:
        raise ValueError(f"{slug}: family {family!r} not in {FAMILIES}")
    return Method(slug, title, family, tuple(entry_points))


METHODS: tuple[Method, ...] = (
    M("care-mla", "CARE: Covariance-Aware and Rank-Enhanced Decomposition for Enabling Multi-Head Latent Attention", "compress", "rankwise.compress.mla:convert_to_mla", "rankwise.compress.mla:decompose_kv", "rankwise.compress.mla:allocate_ranks", "rankwise.compress.mla:save_mla", "rankwise.compress.mla:load_mla", "rankwise.core.linalg:whitened_low_rank", "rankwise.compress.mla_deploy:convert_to_deployable_mla", "rankwise.compress.mla_deploy:export_deepseek_v3"),
    M("coa-lora", "On-the-Fly Adaptation to Quantization: Configuration-Aware LoRA for Efficient Fine-Tuning of Quantized LLMs", "adapters"),
    M("codequant", "CodeQuant: Unified Clustering and Quantization for Enhanced Outlier Smoothing in Low-Precision Mixture-of-Experts", "compress"),
    M("consistent-lra", "Consistent Low-Rank Approximation", "algorithms"),
    M("dfa-feedback-matching", "Enabling Fine-Tuning of Direct Feedback Alignment via Feedback-Weight Matching", "training"),
    M("diff-interpretation-tuning", "Learning to Interpret Weight Differences in Language Models", "training"),
    M("diffgda", "Learning Structure-Semantic Evolution Trajectories for Graph Domain Adaptation", "training"),
    M("emac-autta", "Exposing Mixture and Annotating Confusion for Active Universal Test-Time Adaptation", "training"),
    M("escape-directions", "Saddle-To-Saddle Dynamics in Deep ReLU Networks: Low-Rank Bias in the First Saddle Escape", "theory"),
    M("frequency-representation-learning", "Breaking Scale Anchoring: Frequency Representation Learning for Accurate High-Resolution Inference from Low-Resolution Training", "nn"),
    M("guardspace", "A Guardrail for Safety Preservation: When Safety-Sensitive Subspace Meets Harmful-Resistant Null-Space", "adapters", "rankwise.adapters.guardspace:GuardSpaceConfig", "rankwise.adapters.guardspace:GuardSpaceAdapter", "rankwise.adapters.guardspace_split:guarded_split"),
    M("hybrid-online-learning", "Oracle-efficient Hybrid Learning with Constrained Adversaries", "algorithms"),
    M("ivq-concept-bottleneck", "Escaping Low-Rank Traps: Interpretable Visual Concept Learning via Implicit Vector Quantization", "nn"),
    M("la-lora", "Rethinking LoRA for Privacy-Preserving Federated Learning in Large Models", "adapters"),
    M("lmao", "Three Forward, One Backward: Memory-Efficient Full-Rank Fine-Tuning of Large Models via Extra Forward Passes", "optim"),
    M("lora-pre", "Taming Momentum: Rethinking Optimizer States Through Low-Rank Approximation", "optim", "rankwise.optim:LoRAPre", "rankwise.optim:LoRAPreMuon", "rankwise.optim:low_rank_param_groups", "rankwise.optim:galore_adamw", "rankwise.optim:optimizer_state_bytes"),
    M("lorax", "Low rank adaptation of chemical foundation models generates effective odorant representations", "adapters"),
    M("lorsa", "Towards Understanding the Nature of Attention with Low-Rank Sparse Decomposition", "nn"),
    M("loss-curve-collapse", "Scaling with Collapse: Efficient and Predictable Training of LLM Families", "theory"),
    M("lowprec-flash-attention", "Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention", "training"),
    M("lrnn", "Deep Learning with Learnable Product-Structured Activations", "nn"),
    M("martingale-posterior-uq", "Frozen Priors, Fluid Forecasts: Prequential Uncertainty for Low-Data Deployment with Pretrained Generative Models", "algorithms"),
    M("metavla", "MetaVLA: Unified Meta Co-Training for Efficient Embodied Adaptation", "training"),
    M("microscaling-ue5m3", "Is Finer Better? The Limits of Microscaling Formats in Large Language Models", "quant", "rankwise.quant.formats:FloatFormat", "rankwise.quant.block:quantize", "rankwise.quant.fake_quant:quantize_linears_", "rankwise.quant.storage:save_quantized", "rankwise.quant.error_model:gaussian_terms"),
    M("mixture-of-memories", "MoM: Linear Sequence Modeling with Mixture-of-Memories", "nn"),
    M("multitask-lora-trigger", "JailbreakLoRA: Your Downloaded LoRA from Sharing Platforms might be Unsafe", "adapters"),
    M("palc", "PALC: Preference Alignment via Logit Calibration", "training"),
    M("peso", "Continual Low-Rank Adapters for LLM-based Generative Recommender Systems", "adapters"),
    M("pft-fer", "Personalized Feature Translation for Expression Recognition: An Efficient Source-Free Domain Adaptation Method", "training"),
    M("pica", "PiCa: Parameter-Efficient Fine-Tuning with Column Space Projection", "adapters", "rankwise.adapters:PicaConfig", "rankwise.adapters:add_adapter", "rankwise.training:train"),
    M("plop", "PLoP: Precise LoRA Placement for Efficient Finetuning of Large Models", "adapters", "rankwise.adapters.plop:nfn_scores", "rankwise.adapters.plop:plop_targets", "rankwise.commands.place:run"),
    M("portable-adapter", "CAR-LoRA: Training Compression-Aware and Robust LoRA Adapters for Evolving LLMs", "adapters"),
    M("quantized-relu-training", "Tractability via Low Dimensionality: The Parameterized Complexity of Training Quantized Neural Networks", "theory"),
    M("sample-weight-decay", "The Rank and Gradient Lost in Non-stationarity: Sample Weight Decay for Mitigating Plasticity Loss in Reinforcement Learning", "training"),
    M("task-arithmetic-fairness", "On Fairness of Task Arithmetic: The Role of Task Vectors", "training"),
    M("trady", "Study of Training Dynamics for Memory-Constrained Fine-Tuning", "training"),
    M("tubal-rank-recovery", "The Power of Small Initialization in Noisy Low-Tubal-Rank Tensor Recovery", "algorithms"),
    M("wasi", "Efficient Resource-Constrained Training of Transformers via Subspace Optimization", "training"),
)

BY_SLUG = {m.slug: m for m in METHODS}


def get_method(slug: str) -> Method:
    if slug not in BY_SLUG:
        raise UnknownNameError(f"unknown method {slug!r}; `rankwise list` shows the {len(METHODS)} known slugs")
    return BY_SLUG[slug]


def methods_with_reproduction() -> list[Method]:
    return [m for m in METHODS if m.has_reproduction()]


def markdown_table() -> str:
    """The README's method table, generated from the catalogue."""
    lines = ["| method | paper | family | status | full-run claims |", "|---|---|---|---|---|"]
    for m in METHODS:
        report_link = f"[{m.claims_summary()}](docs/results/{m.slug}/report.md)" if m.claims_summary() else ""
        lines.append(f"| `{m.slug}` | {m.title} | {m.family} | {m.status} | {report_link} |")
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
