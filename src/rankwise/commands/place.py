"""`rankwise place --model smollm2-135m --task wiki-lm`: PLoP's module-type scores and the LoRA placement they pick."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("place", help="PLoP: score module types by normalised feature norm and choose LoRA targets")
    p.add_argument("--model", required=True, help="smollm2-135m, minilm-l6, or a saved transformers folder")
    p.add_argument("--task", required=True, choices=("wiki-lm", "wiki-topics"), help="task whose inputs are scored")
    p.add_argument("--examples", type=int, default=64, help="task examples to score on (default 64)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("-k", "--num-types", type=int, default=3, help="module types to adapt (default 3)")
    p.add_argument("--top-k-layers", type=int, default=None, help="score only the top K layers (those you will adapt)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random-direction baseline")
    p.add_argument("--json", type=Path, help="also write scores and targets to this JSON file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
