"""`rankwise eval ppl --model NAME_OR_PATH`: held-out perplexity on the wiki corpus."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model")
    what = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    ppl = what.add_parser("ppl", help="perplexity on non-overlapping windows of a wiki split")
    ppl.add_argument("--model", required=True, help="smollm2-135m, or a saved transformers folder")
    ppl.add_argument("--split", default="eval", choices=("calibration", "train", "eval"))
    ppl.add_argument("--seq-len", type=int, default=512)
    ppl.add_argument("--max-windows", type=int, default=None, help="evaluate only the first N windows (default: all)")
    ppl.add_argument("--batch-size", type=int, default=4)
    ppl.set_defaults(func=run_ppl)


def run_ppl(args: argparse.Namespace) -> int:
    from rankwise.data import token_windows
    from rankwise.eval import perplexity
    from rankwise.models import load_model

    model, tokenizer = load_model(args.model)
    windows = token_windows(tokenizer, args.split, args.seq_len, args.max_windows)
    result = perplexity(model, windows, batch_size=args.batch_size)
    print(f"{args.model} on wiki/{args.split}, {windows.size(0)} windows of {args.seq_len} tokens: {result}")
    return 0
