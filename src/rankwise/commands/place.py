"""`rankwise place --model smollm2-135m --task wiki-lm`: PLoP's module-type scores and the LoRA placement they pick."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rankwise.commands.common import check_output, positive_int, require_model
from rankwise.models import folders


# What `--model` may be: an original model or a quantized one (as finetune, whose targets PLoP picks).
ACCEPTS = frozenset({folders.EMBEDDED, folders.MODEL, folders.QUANTIZED, folders.MLA_DEPLOY})


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("place", help="PLoP: score module types by normalised feature norm and choose LoRA targets",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="smollm2-135m, minilm-l6, or a saved transformers folder")
    p.add_argument("--task", required=True, choices=("wiki-lm", "wiki-topics"), help="task whose inputs are scored")
    p.add_argument("--examples", type=positive_int, default=64, help="task examples to score on")
    p.add_argument("--seq-len", type=positive_int, default=64, help="tokens per example")
    p.add_argument("--batch-size", type=positive_int, default=16, help="examples per forward pass")
    p.add_argument("-k", "--num-types", type=positive_int, default=3, help="module types to adapt")
    p.add_argument("--top-k-layers", type=positive_int, default=None, help="score only the top K layers, those you will adapt (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random-direction baseline")
    p.add_argument("--json", type=Path, help="also write scores and targets to this JSON file (default: not written)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_model(args.model, "place", ACCEPTS, causal=args.task == "wiki-lm")
    if args.json is not None:
        check_output(args.json, "--json", folder=False)
    from rankwise.adapters import top_layers
    from rankwise.adapters.plop import nfn_scores, plop_targets, type_label
    from rankwise.core.io import write_json_atomic
    from rankwise.data.batches import task_batches
    from rankwise.models import load_model

    model, tokenizer = load_model(args.model)
    batches = task_batches(tokenizer, args.task, args.examples, args.seq_len, args.batch_size)
    scores = nfn_scores(model, batches, seed=args.seed, layers=top_layers(model, args.top_k_layers))
    ranking = scores.ranking()
    width = max(len(type_label(t)) for t in ranking)
    print(f"NFN per module type on {args.task} ({args.examples} examples, mean over {len(next(iter(scores.type_members.values())))} layers); lowest first:")
    for t in ranking:
        print(f"  {type_label(t):<{width}}  {scores.per_type[t]:.4f}")
    targets = plop_targets(scores, args.num_types)
    inverse = plop_targets(scores, args.num_types, inverse=True)
    print(f"PLoP target_modules (lowest {args.num_types}): {json.dumps(targets)}")
    print(f"PLoP^-1 control (highest {args.num_types}):    {json.dumps(inverse)}")
    if args.json:
        write_json_atomic(args.json, {"model": args.model, "task": args.task, "per_type": scores.per_type,
                                      "per_module": scores.per_module, "target_modules": targets, "inverse": inverse})
    return 0
