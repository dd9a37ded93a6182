"""`rankwise eval ppl --model NAME_OR_PATH`: held-out perplexity on the wiki corpus.

`--model` may be an embedded causal LM, a model folder (a transformers model, an MLA conversion, a deployable MLA,
a quantized model) or an adapter folder, which is evaluated on its base model (the one its adapter_config.json or
its finetune run's metrics.json records, or `--base`).
"""

from __future__ import annotations

import argparse

from rankwise.commands.common import positive_int, require_model
from rankwise.models import folders

ACCEPTS = frozenset({folders.EMBEDDED, folders.MODEL, folders.MLA_ONESHOT, folders.MLA_DEPLOY, folders.QUANTIZED, folders.ADAPTER})


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model or an adapter", description=__doc__.split("\n\n")[0])
    what = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    ppl = what.add_parser("ppl", help="perplexity on non-overlapping windows of a wiki split", description=__doc__)
    ppl.add_argument("--model", required=True,
                     help="smollm2-135m, a saved model folder, or an adapter folder (evaluated on its base model)")
    ppl.add_argument("--base", default=None,
                     help="an adapter's base model, when its folder does not record it (default: the recorded one)")
    ppl.add_argument("--split", default="eval", choices=("calibration", "train", "eval"), help="wiki split to score")
    ppl.add_argument("--seq-len", type=positive_int, default=512, help="tokens per window")
    ppl.add_argument("--max-windows", type=positive_int, default=None, help="evaluate only the first N windows (default: all)")
    ppl.add_argument("--batch-size", type=positive_int, default=4, help="windows per forward pass")
    ppl.set_defaults(func=run_ppl)


def run_ppl(args: argparse.Namespace) -> int:
    from rankwise.errors import InvalidInputError

    info = require_model(args.model, "eval ppl", ACCEPTS, causal=True)
    base = None
    if info.kind == folders.ADAPTER:
        base = args.base or info.base
        if base is None:
            raise InvalidInputError(f"--model {args.model}: {info.summary}; name its base model with --base")
        folders.check_adapter_base(info, base, explicit=args.base is not None)
        folders.check_sequence_length(require_model(base, "eval ppl (the adapter's base)", ACCEPTS - {folders.ADAPTER},
                                                    causal=True), args.seq_len)
    elif args.base is not None:
        raise InvalidInputError(f"--base is for adapter folders; {args.model} is a {info.kind} ({info.summary})")
    else:
        folders.check_sequence_length(info, args.seq_len)

    from rankwise.data import token_windows
    from rankwise.eval import perplexity
    from rankwise.models import load_model

    if base is not None:
        from rankwise.adapters import load_adapter

        model, tokenizer = load_model(base)
        model = load_adapter(model, args.model)
        label = f"{args.model} (adapter on {base})"
    else:
        model, tokenizer = load_model(args.model)
        label = args.model
    windows = token_windows(tokenizer, args.split, args.seq_len, args.max_windows)
    result = perplexity(model, windows, batch_size=args.batch_size)
    print(f"{label} on wiki/{args.split}, {windows.size(0)} windows of {args.seq_len} tokens: {result}")
    return 0
