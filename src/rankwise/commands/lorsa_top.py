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


def run(args: argparse.Namespace) -> int:
    from rankwise.data import token_windows
    from rankwise.errors import InvalidInputError
    from rankwise.models import load_model
    from rankwise.nn.lorsa import load_lorsa, top_activating_contexts
    from rankwise.repro.lorsa.capture import capture_attention

    lorsa, source = load_lorsa(args.folder)
    model_name, layer = args.model or source.get("model"), args.layer if args.layer is not None else source.get("layer")
    if model_name is None or layer is None:
        raise InvalidInputError(f"{args.folder} does not record its model and layer: pass --model and --layer")
    if not 0 <= args.head < lorsa.config.n_ov:
        raise InvalidInputError(f"--head must be in [0, {lorsa.config.n_ov}), got {args.head}")
    if args.n < 1 or args.windows < 1 or args.context < 0:
        raise InvalidInputError("--n and --windows must be >= 1 and --context >= 0")
    seq_len = args.seq_len or int(source.get("seq_len", 128))
    model, tokenizer = load_model(model_name)
    windows = token_windows(tokenizer, args.split, seq_len, args.windows)
    x, _ = capture_attention(model, windows, int(layer))
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
