"""`rankwise demo`: the main job. What the library does on the embedded SmolLM2, in under three minutes."""

from __future__ import annotations

import argparse
import time

DEMO_EVAL_WINDOWS = 12
DEMO_SEQ_LEN = 512


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="show what rankwise does on the embedded SmolLM2 (a few minutes, offline)")
    p.add_argument("--prompt", default="In one sentence, what is a low-rank matrix?", help="what the demo asks SmolLM2 first")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from rankwise.core.seed import set_seed
    from rankwise.data import token_windows
    from rankwise.demos import DemoContext
    from rankwise.eval import config_kv_bytes_per_token, measured_kv_bytes_per_token, perplexity
    from rankwise.models import load_model
    from rankwise.registry import METHODS, STATUSES, demo_headlines

    start = time.perf_counter()
    set_seed(0)
    print("== rankwise demo: SmolLM2-135M-Instruct, offline, on this CPU ==")
    t = time.perf_counter()
    model, tokenizer = load_model("smollm2-135m")
    params = sum(p.numel() for p in model.parameters())
    print(f"loaded SmolLM2-135M ({params / 1e6:.1f}M parameters, fp32) in {time.perf_counter() - t:.1f} s")

    chat = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**chat, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    answer = tokenizer.decode(out[0, chat["input_ids"].size(1) :], skip_special_tokens=True).strip()
    print(f"\nuser: {args.prompt}\nSmolLM2: {answer}\n")

    windows = token_windows(tokenizer, "eval", DEMO_SEQ_LEN, DEMO_EVAL_WINDOWS)
    ppl = perplexity(model, windows)
    print(f"held-out wiki perplexity ({windows.size(0)} windows of {DEMO_SEQ_LEN} tokens): {ppl.perplexity:.2f}")
    measured = measured_kv_bytes_per_token(model)
    print(f"KV cache: {measured:,.0f} bytes per token measured from the cache tensors "
          f"(config predicts {config_kv_bytes_per_token(model.config):,} in fp32)")

    ctx = DemoContext(model, tokenizer, windows, ppl.perplexity, token_windows(tokenizer, "calibration", DEMO_SEQ_LEN, 8))
    for _, headline in demo_headlines():  # one per method whose record names a demo, in catalogue order
        print()
        headline(ctx)

    counts = {s: sum(m.status == s for m in METHODS) for s in STATUSES}
    print(f"\ncatalogue: {len(METHODS)} methods ({', '.join(f'{n} {s}' for s, n in counts.items())}); `rankwise list` for details")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    return 0
