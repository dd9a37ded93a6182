"""Demo headline for LoRA-Pre: optimizer-state memory of AdamW vs LoRA-Pre for all of SmolLM2-135M's parameters."""

from __future__ import annotations

import time

import torch
from torch import nn

from rankwise.demos import DemoContext

RANK = 32
TOKENS = 32  # one short batch: enough to create every optimizer state


def headline(ctx: DemoContext) -> None:
    from rankwise.optim import LoRAPre, optimizer_state_bytes, split_low_rank_params

    start = time.perf_counter()
    batch = ctx.eval_windows[:1, :TOKENS]
    names = [n for n, _ in ctx.model.named_parameters()]
    params = [p for _, p in ctx.model.named_parameters()]
    with torch.enable_grad():  # gradients via autograd.grad: the demo model's .grad fields stay untouched
        loss = ctx.model(input_ids=batch, labels=batch).loss
        grads = torch.autograd.grad(loss, params)
    low = {n for n, _ in split_low_rank_params(ctx.model)[0]}
    sizes = {}
    for label in ("AdamW", f"LoRA-Pre r={RANK}"):
        copies = {n: nn.Parameter(p.detach().clone()) for n, p in zip(names, params)}  # the optimizers step copies
        for (n, c), g in zip(copies.items(), grads):
            c.grad = g
        if label == "AdamW":
            opt = torch.optim.AdamW(copies.values(), lr=1e-4)
        else:
            opt = LoRAPre([{"params": [c for n, c in copies.items() if n in low], "rank": RANK},
                           {"params": [c for n, c in copies.items() if n not in low], "rank": None}], lr=1e-4)
        opt.step()
        sizes[label] = (optimizer_state_bytes(opt), optimizer_state_bytes(opt, [c for n, c in copies.items() if n in low]))
        del opt, copies
    (a_total, a_low), (l_total, l_low) = sizes.values()
    mb = 2**20
    print(f"LoRA-Pre (lora-pre): Adam moments kept as rank-{RANK} factors, measured after one step on SmolLM2-135M")
    print(f"  attention+MLP matrices ({len(low)}): AdamW {a_low / mb:.0f} MB of state, LoRA-Pre {l_low / mb:.1f} MB ({l_low / a_low:.1%})")
    print(f"  whole model (embeddings and norms keep AdamW): AdamW {a_total / mb:.0f} MB, LoRA-Pre {l_total / mb:.0f} MB ({l_total / a_total:.0%})")
    print("  (`rankwise repro lora-pre` pretrains a small Llama with both and GaLore, and fine-tunes MiniLM against "
          f"AdamW and LoRA; {time.perf_counter() - start:.0f} s)")
