"""`rankwise convert mla`: convert a model's GQA attention to MLA, report perplexity and KV saving (care-mla).

    rankwise convert mla --model smollm2-135m --kv-rank 48 --method care --allocation adjusted --out DIR
    rankwise convert mla --model smollm2-135m --kv-rank 80 --deploy --heal 40 --out DIR
    rankwise convert mla --model smollm2-135m --kv-rank 48 --calibration-text my_domain.txt --eval-text held_out.txt

The first writes the one-shot form (`load_model(DIR)` reloads it); `--deploy` builds a real MLA model with a
latent-only cache and writes it as a stock DeepSeek-V3 checkpoint (`AutoModelForCausalLM.from_pretrained(DIR)` loads
it offline) whose cache holds 2 * kv-rank + rope-dims numbers per token and layer; `--heal STEPS` first recovers
quality by distilling from the original.

Calibration: CARE and the other whitened methods fit the text they are calibrated on, so calibrate on text like the
text the model will serve: `--calibration-text FILE` (UTF-8; a few thousand tokens already help). Without it the
calibration set is `--calibration`: by default a mix of encyclopedic (wiki) and technical (Python reference) prose.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.commands.choices import (MLA_ALLOCATIONS, MLA_CALIB_SAMPLES, MLA_CALIB_SEQ_LEN, MLA_METHODS, MLA_SCORES,
                                       ROPE_SELECTIONS)
from rankwise.commands.common import check_output, checkpoint_note, nonnegative_float, nonnegative_int, positive_int, require_model
from rankwise.models import folders

# What `--model` may be: an original Llama-family model (embedded or a folder); conversions are refused up front.
ACCEPTS = frozenset({folders.EMBEDDED, folders.MODEL})
MODEL_TYPES = ("llama", "mistral")
CALIBRATION_SETS = ("mix", "wiki", "python-docs")


def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("mla", help="GQA/MHA -> multi-head latent attention, one-shot (CARE and baselines)",
                         description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="smollm2-135m, or a saved Llama-family transformers folder")
    p.add_argument("--kv-rank", type=positive_int, required=True, help="latent dims per matrix per layer (mean, if adjusted); 48 of 192 saves 75%% of SmolLM2's KV cache")
    p.add_argument("--method", default="care", choices=MLA_METHODS, help="factorization: care (CARE), or a baseline (svd = palu, asvd, svd-llm, mha2mla)")
    p.add_argument("--allocation", default="uniform", choices=MLA_ALLOCATIONS, help="uniform ranks, or CARE's water-filling ('adjusted')")
    p.add_argument("--score", default="paper", choices=MLA_SCORES, help="adjusted allocation's score: the paper's formula or the authors' code")
    p.add_argument("--damping", type=nonnegative_float, default=None, help="relative damping of C, >= 0 (default: 0.1 for care, 0.01 for svd-llm)")
    p.add_argument("--calib-samples", type=positive_int, default=MLA_CALIB_SAMPLES, help="calibration windows (default %(default)s)")
    p.add_argument("--calib-seq-len", type=positive_int, default=MLA_CALIB_SEQ_LEN, help="tokens per calibration window (default %(default)s)")
    p.add_argument("--calibration", default="mix", choices=CALIBRATION_SETS,
                   help="built-in calibration set when no --calibration-text is given: half wiki, half python-docs ('mix', default), or one domain")
    p.add_argument("--calibration-text", type=Path, default=None, metavar="FILE",
                   help="calibrate on your own text (UTF-8 file): --calib-samples windows of --calib-seq-len tokens, or all if fewer (default: none)")
    p.add_argument("--eval-text", type=Path, default=None, metavar="FILE",
                   help="also report perplexity on this UTF-8 text (--eval-windows windows of --seq-len tokens; default: none)")
    p.add_argument("--eval-windows", type=nonnegative_int, default=8, help="held-out windows for perplexity; 0 skips it (default %(default)s)")
    p.add_argument("--seq-len", type=positive_int, default=512, help="tokens per perplexity window")
    p.add_argument("--seed", type=int, default=0, help="seeds the choice of calibration windows")
    p.add_argument("--out", type=Path, help="write the converted model here, a new folder (default: not saved)")
    p.add_argument("--overwrite", action="store_true", help="replace --out even if it holds files rankwise did not write")
    add_deploy_arguments(p)
    p.set_defaults(func=run, on_interrupt=interrupted)


def check_arguments(args: argparse.Namespace) -> None:
    """Everything that can be checked before loading the model: the model's kind, the ranks its config allows, the
    text files (readable, long enough for one window) and the output folders."""
    info = require_model(args.model, "convert mla", ACCEPTS, causal=True, model_types=MODEL_TYPES)
    if args.out is not None:
        check_output(args.out, kind="mla-deploy" if wants_deploy(args) else "mla-oneshot", overwrite=args.overwrite, sources=(str(args.model),))
    heal_dir = getattr(args, "heal_dir", None)
    if heal_dir:
        check_output(heal_dir, "--heal-dir", checkpoints=True)
        if args.out is not None:
            check_apart(Path(args.out), Path(heal_dir))
    check_ranks(args, folders.model_dims(info))
    windows = (("calibration_text", getattr(args, "calib_seq_len", None)),
               ("eval_text", args.seq_len if getattr(args, "eval_windows", 1) else None))
    for name, seq_len in windows:
        path = getattr(args, name, None)
        if path is not None:
            check_text_length(read_text(path, f"--{name.replace('_', '-')}"), path, f"--{name.replace('_', '-')}", seq_len)


def check_apart(out: Path, heal_dir: Path) -> None:
    """--out is written whole at the end (it replaces the folder there), --heal-dir holds the healing checkpoints:
    one inside the other would make the final write refuse, or delete, the other, after all the work."""
    from rankwise.errors import InvalidInputError

    a, b = out.expanduser().resolve(), heal_dir.expanduser().resolve()
    if a == b or a in b.parents or b in a.parents:
        raise InvalidInputError(f"--out {out} and --heal-dir {heal_dir} overlap: the converted model is written to --out "
                                "as a whole and the healing checkpoints to --heal-dir; give two separate folders")


def check_ranks(args: argparse.Namespace, dims: dict[str, int]) -> None:
    """--kv-rank (and, for --deploy, --rope-dims and the latent cache) against the model's K/V sizes from its config,
    before it loads: the conversion refuses them only after the model is loaded and calibrated. Nothing is checked
    when the sizes are unknown (the conversion still refuses then)."""
    from rankwise.errors import InvalidInputError

    heads, head_dim = dims.get("num_key_value_heads"), dims.get("head_dim")
    if heads is None or head_dim is None:
        return
    kv_width = heads * head_dim
    if args.kv_rank > kv_width:
        raise InvalidInputError(f"--kv-rank {args.kv_rank} exceeds {args.model}'s K/V width of {kv_width} ({heads} KV heads "
                                f"x {head_dim} dims) per matrix and layer: choose --kv-rank at most {kv_width} "
                                f"(e.g. {kv_width // 4} keeps a quarter of the KV cache)")
    if not wants_deploy(args):
        return
    rope_dims = getattr(args, "rope_dims", None)
    if rope_dims is not None and (rope_dims % 2 or not 2 <= rope_dims <= head_dim):
        raise InvalidInputError(f"--rope-dims {rope_dims} must be an even number in [2, {head_dim}] ({args.model}'s head dim)")
    check_latent_cache(args.kv_rank, rope_dims or head_dim // 2, kv_width)


def check_latent_cache(kv_rank: int, rope_dims: int, kv_width: int) -> None:
    """A deployable MLA caches 2 * kv_rank + rope_dims numbers per token and layer: refuse more than the original's
    2 * kv_width (the conversion would only cost memory)."""
    from rankwise.errors import InvalidInputError

    if 2 * kv_rank + rope_dims > 2 * kv_width:
        raise InvalidInputError(
            f"--kv-rank {kv_rank} with --rope-dims {rope_dims} caches {2 * kv_rank + rope_dims} numbers per token "
            f"and layer, more than the original's {2 * kv_width}: choose --kv-rank below {(2 * kv_width - rope_dims) // 2 + 1}"
        )


def read_text(path: Path, flag: str) -> str:
    """A UTF-8 text file's contents; a clear error for a missing, unreadable, binary or empty file."""
    from rankwise.core.path_limits import check_path_limits, shown
    from rankwise.errors import InvalidInputError

    check_path_limits(path, f"{flag} {shown(path)}", output=False)
    if not Path(path).is_file():
        raise InvalidInputError(f"{flag} {path}: no such file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"{flag} {path} is not UTF-8 text ({e})") from e
    except OSError as e:
        raise InvalidInputError(f"{flag} {path} cannot be read ({e.strerror or e})") from e
    if not text.strip():
        raise InvalidInputError(f"{flag} {path} is empty")
    return text


def check_text_length(text: str, path: Path, flag: str, seq_len: int | None) -> None:
    """Refuse a text too short for one window of `seq_len` tokens, before the model (and its tokenizer) load.

    Without the tokenizer the token count is bounded above by the UTF-8 bytes: the byte-level BPE of Llama-family
    models (and SentencePiece with byte fallback) never makes more tokens than bytes, plus one EOS per document and
    a possible prefix token. A text under that bound cannot fill a window whatever the tokenizer; one above it is
    counted exactly when the windows are cut."""
    from rankwise.errors import InvalidInputError

    if seq_len is None:
        return
    most = len(text.encode("utf-8")) + 2
    if most < seq_len:
        raise InvalidInputError(f"{flag} {path} has {len(text.encode('utf-8'))} bytes of text, so at most {most} tokens: "
                                f"fewer than one window of {seq_len} tokens; pass a longer text or a shorter "
                                f"{'--calib-seq-len' if flag == '--calibration-text' else '--seq-len'}")


def calibration_set(args: argparse.Namespace, tokenizer):
    """The calibration windows [N, T] and a one-line description: the user's text, or a built-in set."""
    from rankwise.compress.mla.calibration import calibration_windows, text_calibration_windows
    from rankwise.data import token_windows
    from rankwise.data.domains import calibration_mix_windows, domain_windows

    if args.calibration_text is not None:
        windows = text_calibration_windows(tokenizer, read_text(args.calibration_text, "--calibration-text"),
                                           args.calib_seq_len, args.calib_samples, args.seed)
        return windows, f"{windows.size(0)} x {windows.size(1)} tokens of {args.calibration_text}"
    if args.calibration == "mix":
        windows = calibration_mix_windows(tokenizer, args.calib_samples, args.calib_seq_len, args.seed)
    elif args.calibration == "wiki":
        windows = calibration_windows(token_windows(tokenizer, "calibration", args.calib_seq_len), args.calib_samples, args.seed)
    else:
        windows = calibration_windows(domain_windows(tokenizer, args.calibration, "calibration", args.calib_seq_len), args.calib_samples, args.seed)
    return windows, f"{windows.size(0)} x {windows.size(1)} tokens, built-in set {args.calibration!r}"


def eval_text_windows(args: argparse.Namespace, tokenizer):
    """Perplexity windows [W, T] of --eval-text, or None."""
    if getattr(args, "eval_text", None) is None or args.eval_windows == 0:
        return None
    from rankwise.data.domains import cut_windows, text_stream

    return cut_windows(text_stream(tokenizer, read_text(args.eval_text, "--eval-text")), args.seq_len, args.eval_windows)


def interrupted(args: argparse.Namespace) -> str:
    heal_dir = getattr(args, "heal_dir", None)
    if heal_dir:
        return checkpoint_note(Path(heal_dir) / "checkpoint", "rerun the same command (same --heal-dir) to resume healing")
    return "Nothing was written (a conversion is written only when it is complete); run the command again."


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    if wants_deploy(args):
        return run_deploy(args)
    from rankwise.compress.mla.convert import convert_to_mla
    from rankwise.compress.mla.io import save_mla
    from rankwise.compress.mla.layout import kv_layout, kv_saving, mla_info
    from rankwise.core.seed import set_seed
    from rankwise.data import token_windows
    from rankwise.eval import measure, perplexity
    from rankwise.models import load_model

    set_seed(args.seed)
    model, tokenizer = load_model(args.model)
    layout = kv_layout(model)
    # The text windows first: a text that tokenizes to less than one window is refused before the perplexities.
    calibration, described = calibration_set(args, tokenizer)
    own = eval_text_windows(args, tokenizer)
    windows = token_windows(tokenizer, "eval", args.seq_len, args.eval_windows) if args.eval_windows > 0 else None
    before = perplexity(model, windows, desc="perplexity (original)") if windows is not None else None
    own_before = perplexity(model, own, desc="perplexity (original, --eval-text)") if own is not None else None

    converted, took = measure(
        convert_to_mla, model, args.kv_rank, args.method, args.allocation, calibration,
        score=args.score, damping=args.damping, inplace=True,
    )
    info = mla_info(converted)
    print(f"converted {args.model} ({layout.num_layers} layers, KV width {layout.kv_width}) with {info['method']}, "
          f"{info['allocation']} ranks{' (' + info['score'] + ' score)' if info['allocation'] == 'adjusted' else ''}, "
          f"mean rank {args.kv_rank}, in {took.wall_s:.1f} s (calibration: {described})")
    if info["allocation"] == "adjusted":
        print(f"  K ranks per layer: {info['k_ranks']}")
        if not info["joint"]:
            print(f"  V ranks per layer: {info['v_ranks']}")
    print(f"KV-cache saving: {100 * kv_saving(converted):.1f}% (latent r_K + r_V per token vs 2 x {layout.kv_width}; "
          "one-shot form: RoPE is applied after the up-projection, so this is the saving a latent cache would give)")
    if before is not None:
        after = perplexity(converted, windows, desc="perplexity (converted)")
        print(f"perplexity on {windows.size(0)} held-out windows of {args.seq_len} tokens: "
              f"{before.perplexity:.2f} before -> {after.perplexity:.2f} after")
    if own is not None:
        after = perplexity(converted, own, desc="perplexity (converted, --eval-text)")
        print(f"perplexity on {own.size(0)} windows of {args.eval_text}: {own_before.perplexity:.2f} before -> {after.perplexity:.2f} after")
    if args.out:
        save_mla(converted, args.out, tokenizer, overwrite=args.overwrite)
        print(f"saved to {args.out} (reload with rankwise.models.load_model({str(args.out)!r}))")
    return 0


def add_deploy_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("deployable MLA (latent-only KV cache, decoupled RoPE, DeepSeek-V3 export)")
    g.add_argument("--deploy", action="store_true", help="build a real MLA model with a latent-only cache and write it (--out) as a DeepSeek-V3 checkpoint")
    g.add_argument("--heal", type=nonnegative_int, default=0, metavar="STEPS", help="recovery fine-tune for STEPS steps, the original as teacher (implies --deploy; default 0: none)")
    g.add_argument("--rope-dims", type=positive_int, default=None, help="width of the shared decoupled RoPE key (default: head_dim / 2)")
    g.add_argument("--rope-selection", default="high", choices=ROPE_SELECTIONS, help="which rotary pairs keep RoPE (default %(default)s)")
    g.add_argument("--heal-dir", default=None, help="healing checkpoint folder, resumed if it holds a checkpoint (default: no checkpoints)")


def wants_deploy(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "deploy", False) or getattr(args, "heal", 0))


def run_deploy(args: argparse.Namespace) -> int:
    from rankwise.compress.mla_deploy.build import convert_to_deployable_mla, deploy_info
    from rankwise.compress.mla_deploy.export import export_deepseek_v3
    from rankwise.training.healing import HealConfig, heal
    from rankwise.core.seed import set_seed
    from rankwise.data import token_windows
    from rankwise.eval import measure, measured_kv_bytes_per_token, perplexity
    from rankwise.models import load_model

    set_seed(args.seed)
    model, tokenizer = load_model(args.model)
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    rope_dims = args.rope_dims or head_dim // 2
    kv_width = (getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads) * head_dim
    check_latent_cache(args.kv_rank, rope_dims, kv_width)  # again, from the loaded config (checked up front if known)
    calibration, described = calibration_set(args, tokenizer)  # first: a too-short text is refused before the perplexities
    own = eval_text_windows(args, tokenizer)
    windows = token_windows(tokenizer, "eval", args.seq_len, args.eval_windows) if args.eval_windows > 0 else None
    before = perplexity(model, windows, desc="perplexity (original)") if windows is not None else None
    own_before = perplexity(model, own, desc="perplexity (original, --eval-text)") if own is not None else None
    mla, took = measure(
        convert_to_deployable_mla, model, args.kv_rank, rope_dims, args.rope_selection, calibration,
        allocation=args.allocation, score=args.score, damping=args.damping,
    )
    info = deploy_info(mla)
    gqa, latent = measured_kv_bytes_per_token(model), measured_kv_bytes_per_token(mla)
    print(f"deployable MLA in {took.wall_s:.1f} s: r_K/r_V mean {args.kv_rank}, rope key {rope_dims} dims on pairs {info['rope_pairs']} ({args.rope_selection}); calibration: {described}")
    print(f"KV cache measured: {latent:.0f} bytes/token vs {gqa:.0f} for GQA (saving {100 * (1 - latent / gqa):.1f}%)")
    if windows is not None:
        print(f"perplexity: original {before.perplexity:.2f}, deployable MLA {perplexity(mla, windows, desc='perplexity (MLA)').perplexity:.2f}")
    if own is not None:
        print(f"perplexity on {args.eval_text}: original {own_before.perplexity:.2f}, deployable MLA {perplexity(mla, own, desc='perplexity (MLA, --eval-text)').perplexity:.2f}")
    if args.heal:
        train = token_windows(tokenizer, "train", 64, 2000)
        result = heal(mla, model, train, HealConfig(steps=args.heal, seed=args.seed), checkpoint_dir=args.heal_dir)
        print(f"healed steps {result.start_step}..{result.steps}: loss {result.losses[0] if result.losses else float('nan'):.3f} -> {result.losses[-1] if result.losses else float('nan'):.3f}")
        if windows is not None:
            print(f"perplexity after healing: {perplexity(mla, windows, desc='perplexity (healed)').perplexity:.2f}")
        if own is not None:
            print(f"perplexity after healing on {args.eval_text}: {perplexity(mla, own, desc='perplexity (healed, --eval-text)').perplexity:.2f}")
    if args.out:
        export_deepseek_v3(mla, args.out, tokenizer, overwrite=args.overwrite)
        print(f"wrote a DeepSeek-V3 checkpoint to {args.out} (AutoModelForCausalLM.from_pretrained or rankwise.models.load_model)")
    return 0
