"""Reproduction `portable-adapter` (CAR-LoRA): one LoRA trained over resampled compressions of its base works on
every compressed base about as well as an adapter trained for that base alone, better than a full-precision-trained
LoRA of the same length, also on held-out compressions and on a drifted base.

Card portable-adapter.md (version B, strengthened to the evidence protocol):
- model and task: SmolLM2-135M-Instruct, the top `top_layers` blocks adapted (LoRA r=8, alpha 16, all seven
  projections) and compressed; the hidden state entering them is cached (`training.frozen_prefix`); next-token loss
  on one wiki topic's articles (train split: training, calibration split: validation, eval split: test), softmax
  over the topic's token ids (`training.top_layers_lm`).
- operators that hurt a plain LoRA (issue 24: int8/nf4/fp4 are nearly lossless on these Q4_1-dequantized weights,
  so a LoRA trained as long passed the parity claim as well): training set int3 (b32), nf3 (b64), int2 (b16),
  prune0.4 (40% of MLP channels, base and adapter masked), skip (one block); held out: int4 (b32), nf2 (b32),
  prune0.3.
- arms, each with its own learning-rate grid chosen by its own objective on validation, same batch, schedule and
  seeds: FP LoRA and one per-operator adapter per training operator (the QLoRA-style upper bound) for `steps`;
  CAR-LoRA for `car_factor` x as many (the paper: 20 vs 5 epochs), and an FP LoRA trained as long as CAR-LoRA,
  which the claims against full precision use (the card's pitfall: more training vs compression awareness).
- drifted base θ₀': the adapted blocks continue-trained on the Python docs (`data.domains`), then compressed again;
  adapters trained on θ₀ are evaluated on C(θ₀') unchanged; the transfer claim per operator family (quantizers,
  pruning, layer skip), since the old pooled claim was carried by pruning and skip.
- the parity claim's control is the plain LoRA trained as long (it must miss the margin for the claim to say
  anything). The claims of the first testbed (int8/nf4/fp4, 3 seeds) are retired; these are new, post hoc.
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass

import torch

from rankwise.adapters import AdaptedModel, LoraConfig
from rankwise.quant.compression_ops import parse_operators
from rankwise.recipes.car_lora import CompressedBase
from rankwise.core.discrimination import control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.data.domains import domain_windows
from rankwise.data.topic_windows import topic_windows
from rankwise.repro.portable_adapter.drift import drift_blocks, swap_in
from rankwise.repro.portable_adapter.report import add_tables, plot
from rankwise.repro.portable_adapter.runs import ArmResult, ArmRunner, ArmSpec
from rankwise.repro.setup import BySize, experiment_model
from rankwise.training.frozen_prefix import FrozenPrefixRunner
from rankwise.training.top_layers_lm import CachedWindows, TopLayersLM

TRAIN_OPS = ("int3", "nf3", "int2b16", "prune0.4", "skip")
QUANT_OPS = ("int3", "nf3", "int2b16")
HELD_OUT = ("int4", "nf2b32", "prune0.3")
DRIFT_OPS = ("identity", *TRAIN_OPS)
DRIFT_FAMILIES = {"quant": QUANT_OPS, "prune": ("prune0.4",), "skip": ("skip",)}
TESTBED = ("SmolLM2 top 2 blocks, 'Physical sciences' next-token; train ops " + ",".join(TRAIN_OPS) + "; held out "
           + ",".join(HELD_OUT) + "; 5 seeds")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FP, FP_LONG, CAR = "FP LoRA", "FP LoRA (long)", "CAR-LoRA"
# Declared before any run: "within the margin" = CAR-LoRA's NLL on a quantized base at most this many nats/token
# above the per-operator adapter's (about 2% perplexity).
MATCH_MARGIN = -0.02


@dataclass(frozen=True)
class Settings:
    topic: str
    top_layers: int
    skip_layer: int  # offset inside the adapted blocks of the block `skip` removes
    seq_len: int
    train_windows: int
    val_windows: int
    test_windows: int
    steps: int  # FP LoRA and the per-operator adapters
    car_factor: int  # CAR-LoRA and FP LoRA (long) train car_factor * steps
    batch: int
    rank: int
    lr_grid: tuple[float, ...]
    max_extensions: int
    seeds: int
    drift_windows: int
    drift_steps: int
    drift_lr: float


SIZES = BySize(
    smoke=Settings(topic="Technology", top_layers=2, skip_layer=0, seq_len=9, train_windows=8, val_windows=4,
                   test_windows=4, steps=2, car_factor=2, batch=2, rank=2, lr_grid=(1e-3, 3e-3), max_extensions=0, seeds=2,
                   drift_windows=4, drift_steps=2, drift_lr=1e-4),
    full=Settings(topic="Physical sciences", top_layers=2, skip_layer=0, seq_len=33, train_windows=256, val_windows=48,
                  test_windows=64, steps=24, car_factor=4, batch=8, rank=8, lr_grid=(1e-3, 3e-3, 1e-2), max_extensions=1,
                  seeds=5, drift_windows=96, drift_steps=40, drift_lr=1e-4),
)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("portable-adapter", "CAR-LoRA: one compression-aware LoRA for every compressed and drifted base", size, seed)
    _declare(report)
    set_seed(seed)
    model, tok = experiment_model("smollm2-135m", size, seed)
    return _run(report, s, seed, model, tok)


def _declare(report: Report) -> None:
    new = dict(testbed=TESTBED, post_hoc=True)
    paper = dict(kind=ClaimKind.PAPER, **new)
    report.declare(PairedClaim("car_matches_per_operator_low_bit", "per-seed mean over " + ", ".join(QUANT_OPS) + " of "
                               "test NLL(per-operator adapter on C(θ₀)) - NLL(CAR-LoRA on C(θ₀)) (nats/token); "
                               "non-inferior within the margin", ">=", MATCH_MARGIN, discriminates=control(FP_LONG),
                               **paper))
    report.declare(PairedClaim("car_beats_fp_long_on_training_ops", "per-seed mean over the 5 training operators of "
                               "test NLL(FP LoRA trained as long) - NLL(CAR-LoRA) on C(θ₀)", ">", 0.0, **paper))
    report.declare(PairedClaim("car_beats_fp_long_on_held_out", "per-seed mean over the held-out " + ", ".join(HELD_OUT)
                               + " of test NLL(FP LoRA trained as long) - NLL(CAR-LoRA) on C(θ₀)", ">", 0.0, **paper))
    for family, ops in DRIFT_FAMILIES.items():
        report.declare(PairedClaim(f"car_transfers_to_drifted_{family}", f"per-seed mean over {', '.join(ops)} of test "
                                   "NLL(FP LoRA trained as long) - NLL(CAR-LoRA) on C(θ₀'), the drifted base", ">", 0.0,
                                   **paper))
    report.declare(PairedClaim("fp_long_degrades_on_training_ops", "per-seed mean over the 5 training operators of "
                               "NLL(FP LoRA (long) on C(θ₀)) - NLL(it on θ₀): the compressions hurt a plain LoRA",
                               ">", 0.05, kind=ClaimKind.SANITY, **new))
    report.declare(PairedClaim("drift_costs_fp_long", "per-seed test NLL of FP LoRA (long) on the drifted base θ₀' "
                               "minus on θ₀: the drift is large enough to matter to an adapter", ">", 0.0,
                               kind=ClaimKind.SANITY, **new))
    report.declare(Claim("theta0_unchanged", "1 if the adapted blocks' parameters hash the same after every run as "
                         "before, else 0", ">=", 1.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("frozen_prefix_exact", "max |full-model logits - cached-prefix logits| / max |logits|",
                         "<=", 1e-5, kind=ClaimKind.INVARIANT))


def _hash(blocks) -> str:
    h = hashlib.sha256()
    named = [(f"{i}.{n.replace('base_layer.', '')}", p) for i, b in enumerate(blocks) for n, p in b.named_parameters()
             if "adapters" not in n]
    for n, p in sorted(named, key=lambda item: item[0]):
        h.update(n.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _run(report: Report, s: Settings, seed: int, model, tok) -> Report:
    n_layers = model.config.num_hidden_layers
    top = list(range(n_layers - s.top_layers, n_layers))
    blocks = [model.model.layers[i] for i in top]
    seeds = [seed + k for k in range(s.seeds)]
    hash_before = _hash(blocks)

    say("caching prefix states")
    data = topic_windows(tok, s.topic, s.seq_len, s.train_windows, s.val_windows, s.test_windows)
    docs = domain_windows(tok, "python-docs", "calibration", s.seq_len, s.drift_windows)
    vocab = data.vocabulary()
    runner = FrozenPrefixRunner(model, top[0])
    index = TopLayersLM.token_index(vocab, model.lm_head.weight.size(0))
    task = TopLayersLM(runner, vocab, model.lm_head.weight)
    task.train_set, task.eval_set = CachedWindows(runner, data.train, index), CachedWindows(runner, data.validation, index)
    test = CachedWindows(runner, data.test, index)
    with torch.no_grad():
        full = model(input_ids=data.test[:1, :-1]).logits[0]
        part = model.lm_head(runner.top(test.h[:1]))[0]
        prefix_error = float((full - part).abs().max() / full.abs().max())

    say("drifting the base on the Python docs")
    docs_vocab = torch.unique(docs.flatten())  # the new version learns the docs' distribution, not the topic's
    docs_task = TopLayersLM(runner, docs_vocab, model.lm_head.weight)
    docs_task.name = "python-docs-drift"
    docs_index = TopLayersLM.token_index(docs_vocab, model.lm_head.weight.size(0))
    docs_task.train_set = docs_task.eval_set = CachedWindows(runner, docs, docs_index)
    drifted, drift_size = drift_blocks(blocks, docs_task, s.drift_steps, s.batch, s.drift_lr, seed)

    skip = [top[s.skip_layer]]
    ops = parse_operators([*TRAIN_OPS, *HELD_OUT])
    base = CompressedBase(model, ops, layers=top, skip_layers=skip)
    before = swap_in(blocks, drifted)
    drift_base = CompressedBase(model, [o for o in ops if o.name in DRIFT_OPS], layers=top, skip_layers=skip)
    zero_drift = {op: _nll(drift_base, op, task, test) for op in DRIFT_OPS}
    swap_in(blocks, before)
    all_ops = ["identity", *TRAIN_OPS, *HELD_OUT]
    zero = {op: _nll(base, op, task, test) for op in all_ops}

    adapted = AdaptedModel(model)
    lora = LoraConfig(r=s.rank, lora_alpha=2 * s.rank, target_modules=TARGETS, layers_to_transform=top)
    arms = ArmRunner(adapted, task, base, lora, s.batch)
    long = s.steps * s.car_factor
    specs = [ArmSpec(FP, ("identity",), s.steps), *(ArmSpec(f"per-operator {o}", (o,), s.steps) for o in TRAIN_OPS),
             ArmSpec(CAR, TRAIN_OPS, long), ArmSpec(FP_LONG, ("identity",), long)]
    results: dict[str, ArmResult] = {}
    for spec in specs:
        say(f"arm {spec.name} on {', '.join(spec.operators)}")
        results[spec.name] = a = arms.tune_and_run(spec, s.lr_grid, seeds, s.max_extensions)
        report.record_arm(spec.name, a.selection, budget={"trainable_params": a.seed_runs[0].trainable, "steps": spec.steps,
                                                          "batch": s.batch, "tokens_per_step": s.batch * (s.seq_len - 1)})
    report.check_budgets_matched(["trainable_params", "batch", "tokens_per_step"])  # steps: CAR = FP (long) = factor x

    say("evaluating the adapters on every base")
    nll: dict[str, list[dict[str, float]]] = {}  # arm -> per seed -> op -> test NLL on C(θ₀)
    for name in (FP, FP_LONG, CAR):
        nll[name] = [arms.evaluate(r.state, all_ops, test) for r in results[name].seed_runs]
    for o in TRAIN_OPS:
        name = f"per-operator {o}"
        nll[name] = [arms.evaluate(r.state, ["identity", o], test) for r in results[name].seed_runs]
    before = swap_in(blocks, drifted)
    drift_nll = {name: [arms.evaluate(r.state, list(DRIFT_OPS), test, drift_base) for r in results[name].seed_runs]
                 for name in (FP, FP_LONG, CAR)}
    swap_in(blocks, before)
    base.restore()

    def mean_over(arm: str, op_list, table=nll) -> list[float]:
        return [statistics.fmean(d[o] for o in op_list) for d in table[arm]]

    per_op = [statistics.fmean(nll[f"per-operator {o}"][i][o] for o in QUANT_OPS) for i in range(len(seeds))]
    report.measure_paired("car_matches_per_operator_low_bit", per_op, mean_over(CAR, QUANT_OPS))
    report.get_claim("car_matches_per_operator_low_bit").measure_control(per_op, mean_over(FP_LONG, QUANT_OPS))
    report.measure_paired("car_beats_fp_long_on_training_ops", mean_over(FP_LONG, TRAIN_OPS), mean_over(CAR, TRAIN_OPS))
    report.measure_paired("car_beats_fp_long_on_held_out", mean_over(FP_LONG, HELD_OUT), mean_over(CAR, HELD_OUT))
    for family, ops in DRIFT_FAMILIES.items():
        report.measure_paired(f"car_transfers_to_drifted_{family}", mean_over(FP_LONG, ops, drift_nll),
                              mean_over(CAR, ops, drift_nll))
    report.measure_paired("fp_long_degrades_on_training_ops", mean_over(FP_LONG, TRAIN_OPS),
                          mean_over(FP_LONG, ["identity"]))
    report.measure_paired("drift_costs_fp_long", mean_over(FP_LONG, ["identity"], drift_nll),
                          mean_over(FP_LONG, ["identity"]))
    report.measure("theta0_unchanged", 1.0 if _hash(blocks) == hash_before else 0.0)
    report.measure("frozen_prefix_exact", prefix_error)

    add_tables(report, results, nll, drift_nll, zero, zero_drift, all_ops, TRAIN_OPS, DRIFT_OPS)
    _notes(report, s, top, skip, n_layers, vocab.numel(), data, docs, drift_size)
    report.plots["nll_by_operator"] = plot(nll, drift_nll, zero, all_ops, DRIFT_OPS, (FP, FP_LONG, CAR))
    return report.finish()


def _nll(base: CompressedBase, op: str, task: TopLayersLM, data: CachedWindows) -> float:
    with base.using(op):
        return task.nll(data)


def _notes(report: Report, s: Settings, top, skip, n_layers, vocab_size, data, docs, drift_size) -> None:
    tokens = lambda w: w.size(0) * (w.size(1) - 1)  # noqa: E731
    report.note(f"Task: next-token loss on the '{s.topic}' wiki articles; {data.train.size(0)} training windows of "
                f"{s.seq_len} tokens ({tokens(data.train):,} targets, train split), validation {tokens(data.validation):,} "
                f"targets (calibration split), test {tokens(data.test):,} targets (eval split); softmax over the topic's "
                f"{vocab_size:,} token ids. Adapted and compressed blocks {top[0]}..{top[-1]} of {n_layers} (the prefix "
                f"below is cached); `skip` removes block {skip}.")
    report.note(f"Every arm: LoRA r={s.rank}, alpha {2 * s.rank}, on {', '.join(TARGETS)}; AdamW, batch {s.batch}, warmup "
                f"10% + cosine, clip 1.0; {s.seeds} seeds (LoRA init, batch order and the operator draws). FP LoRA and the "
                f"per-operator adapters train {s.steps} steps; CAR-LoRA and FP LoRA (long) {s.steps * s.car_factor} "
                f"({s.car_factor}x, the paper's 20 vs 5 epochs). The claims against full precision use FP LoRA (long), "
                f"so 'more training' cannot explain a CAR-LoRA gain (card pitfall). Learning rate from {list(s.lr_grid)} "
                f"by the arm's own objective on validation (mean NLL over its operators), extended off an edge up to "
                f"{s.max_extensions} time(s); the first seed's run is the tuning run.")
    report.note(f"Drifted base θ₀': every weight of the adapted blocks continue-trained {s.drift_steps} AdamW steps at lr "
                f"{s.drift_lr:g} (constant) on {docs.size(0)} Python-docs windows (calibration half); relative drift "
                f"||θ₀'-θ₀||/||θ₀|| = {drift_size:.4f} over those blocks. Its compressed forms are recomputed from θ₀'.")
    report.note("SmolLM2's weights are Q4_1-dequantized GGUF weights: int8, nf4, fp4 and mxfp4 re-quantization is "
                "nearly lossless on them, so the first testbed's quantized claims were passed by a plain LoRA trained as "
                "long as well. This testbed's quantizers (3 and 2 bits) hurt a plain LoRA (the sanity claim "
                "fp_long_degrades_on_training_ops and the 'no adapter' column); the parity claim is judged on FP LoRA "
                "(long) as its control, and the drift claim per operator family. The first testbed's claims are "
                "retired (their last verdicts stay below). Intervals are over training seeds on one fixed test text.")
