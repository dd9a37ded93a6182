"""`rankwise lorsa top`: the top-activating contexts of one head of a saved, fitted Lorsa (lorsa).

    rankwise lorsa top DIR --head 12 [--n 10] [--windows 64] [--split eval] [--context 12]

DIR is a folder written by `rankwise.nn.lorsa.save_lorsa` whose `source` names the model and layer it was fitted on
(`{"model": "smollm2-135m", "layer": 15, "seq_len": 128}`; --model / --layer / --seq-len override them). The command
captures the layer's attention input on Wikipedia windows of the split, runs the Lorsa, and prints the contexts where
the head's activation (after the top-K) is largest, with the source token that contributes most to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("top", help="top-activating contexts of a head of a saved Lorsa")
    p.add_argument("folder", type=Path, help="a folder written by rankwise.nn.lorsa.save_lorsa")
    p.add_argument("--head", type=int, required=True, help="OV head index, 0 <= head < n_ov")
    p.add_argument("--n", type=int, default=10, help="how many contexts (default %(default)s)")
    p.add_argument("--windows", type=int, default=64, help="windows of text to scan (default %(default)s)")
    p.add_argument("--split", default="eval", choices=("calibration", "eval", "train"),
                   help="corpus split to scan (default %(default)s)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per window (default: the source's, else 128)")
    p.add_argument("--context", type=int, default=12, help="tokens shown before the active one (default %(default)s)")
    p.add_argument("--model", default=None, help="model name or folder (default: the one the Lorsa was fitted on)")
    p.add_argument("--layer", type=int, default=None, help="attention layer (default: the one it was fitted on)")
    p.set_defaults(func=run)


def source_settings(args: argparse.Namespace, source: dict) -> tuple[str, int, int]:
    """(model, layer, seq_len): the flags, else what the folder's `source` records, checked before the model loads.
    A recorded value of the wrong type is the file's fault (CorruptFileError, naming it); a layer the model does not
    have is refused from the model's config (its number of layers) when that is known."""
    from rankwise.core.json_fields import json_field
    from rankwise.errors import InvalidInputError
    from rankwise.models import folders
    from rankwise.nn.lorsa.io import CONFIG_FILE

    where = args.folder / CONFIG_FILE
    model_name = args.model or json_field(source, "model", str, where)
    layer = args.layer if args.layer is not None else json_field(source, "layer", int, where)
    if model_name is None or layer is None:
        raise InvalidInputError(f"{args.folder} does not record its model and layer: pass --model and --layer")
    seq_len = args.seq_len or json_field(source, "seq_len", int, where, 128)
    if seq_len < 2:
        raise InvalidInputError(f"--seq-len (or the recorded seq_len in {where}) must be at least 2, got {seq_len}")
    layers = folders.model_dims(folders.identify(model_name)).get("num_hidden_layers")
    if layer < 0 or (layers is not None and layer >= layers):
        what = "--layer" if args.layer is not None else f"the layer recorded in {where}"
        bound = f"[0, {layers})" if layers is not None else ">= 0"
        raise InvalidInputError(f"{what} is {layer}, but {model_name}'s attention layers are {bound}: pass --layer")
    return model_name, layer, seq_len


def run(args: argparse.Namespace) -> int:
    from rankwise.data import token_windows
    from rankwise.errors import InvalidInputError
    from rankwise.models import load_model
    from rankwise.nn.lorsa import load_lorsa, top_activating_contexts
    from rankwise.repro.lorsa.capture import capture_attention

    from rankwise.core.path_limits import check_path_limits, shown

    check_path_limits(args.folder, shown(args.folder), output=False)
    lorsa, source = load_lorsa(args.folder)
    model_name, layer, seq_len = source_settings(args, source)
    if not 0 <= args.head < lorsa.config.n_ov:
        raise InvalidInputError(f"--head must be in [0, {lorsa.config.n_ov}), got {args.head}")
    if args.n < 1 or args.windows < 1 or args.context < 0:
        raise InvalidInputError("--n and --windows must be >= 1 and --context >= 0")
    model, tokenizer = load_model(model_name)
    windows = token_windows(tokenizer, args.split, seq_len, args.windows)
    x, _ = capture_attention(model, windows, layer)
    found = top_activating_contexts(lorsa, x, args.head, n=args.n)
    print(f"head {args.head} of {lorsa.config.n_ov} (QK head {args.head // lorsa.config.group_size}), {model_name} "
          f"layer {layer}, {windows.size(0)} {args.split} windows of {seq_len} tokens")
    if not found:
        print("the head is never among the K active heads on these windows (a dead head)")
    for rank, c in enumerate(found, 1):
        ids = windows[c.window]
        before = tokenizer.decode(ids[max(0, c.position - args.context): c.position])
        token = tokenizer.decode(ids[c.position: c.position + 1])
        src = tokenizer.decode(ids[c.source: c.source + 1])
        print(f"{rank:>3}. z = {c.value:+.3f}  window {c.window} pos {c.position}  ...{before}[[{token}]]  "
              f"(top source: {src!r} at {c.source})")
    return 0
