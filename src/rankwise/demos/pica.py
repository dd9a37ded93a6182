"""Demo headline: PiCa fine-tunes SmolLM2's top layers with a handful of shared parameters and exports a PEFT folder."""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import torch

from rankwise.adapters import PicaConfig, add_adapter
from rankwise.core.threads import limit_threads
from rankwise.core.training import fit

TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]
TOP_LAYERS = [28, 29]
RANK, STEPS, SEQ = 8, 6, 64


def headline(ctx) -> None:
    start = time.perf_counter()
    with limit_threads(1, at_most=True):  # small matmuls; a second thread mostly spin-waits on a busy machine
        model = copy.deepcopy(ctx.model)  # the demo's model must stay untouched
        adapted = add_adapter(model, PicaConfig(r=RANK, target_modules=TARGETS, layers_to_transform=TOP_LAYERS))
        # LoRA on the same modules: r * (in + out) per module, counted without building a second model copy.
        lora_count = sum(RANK * (layer.in_features + layer.out_features) for _, layer in adapted.adapted_layers())
        pica_count = adapted.count_parameters().trainable
        train = ctx.calibration_windows[:, : (ctx.calibration_windows.size(1) // SEQ) * SEQ].reshape(-1, SEQ)
        held_out = ctx.eval_windows[:1, :256]
        before = _loss(adapted, held_out)

        def loss_at(step: int) -> torch.Tensor:
            batch = train[step * 4 : step * 4 + 4]  # the next 4 windows, in order
            return adapted(input_ids=batch, labels=batch).loss

        adapted.train()
        fit(adapted, loss_at, STEPS, lambda params: torch.optim.AdamW(params, lr=1e-3))
        after = _loss(adapted, held_out)
        with tempfile.TemporaryDirectory() as tmp:
            adapted.save(Path(tmp) / "pica", base_model_name_or_path="smollm2-135m")
            files = sorted(p.name for p in (Path(tmp) / "pica").iterdir())
    print(f"PiCa (rank {RANK}, one shared matrix per module type, layers {TOP_LAYERS} of SmolLM2): {pica_count:,} trainable "
          f"parameters vs {lora_count:,} for LoRA r={RANK} on the same modules")
    print(f"  {STEPS} steps on wiki text: held-out loss {before:.3f} -> {after:.3f} nats/token; saved as a PEFT folder "
          f"({', '.join(f for f in files if f.startswith('adapter'))}) in {time.perf_counter() - start:.0f} s")


@torch.no_grad()
def _loss(model, ids: torch.Tensor) -> float:
    model.eval()
    return float(model(input_ids=ids, labels=ids).loss)
