"""The reproduction's invariant check: our PCGrad and torchjd's PCGrad on a real per-task Jacobian of the LoRA
factors (one batch of the testbed), under the same global seed (both draw torch.randperm per task)."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.core.seed import set_seed
from rankwise.recipes.multitask import MultiTaskBalancer, MultiTaskConfig, lora_parameters, pcgrad, torchjd_aggregator
from rankwise.repro.multitask_lora_trigger.model import Heads, MultiTaskTop, encoder_layers, lora_minilm
from rankwise.repro.multitask_lora_trigger.tasks import TASKS
from rankwise.repro.multitask_lora_trigger.train import Cached, Protocol, losses


def pcgrad_agreement(base: nn.Module, p: Protocol, train: Cached, seed: int) -> float:
    """max |ours - torchjd| / max |torchjd| of the PCGrad update on one batch's task Jacobian (float64)."""
    set_seed(seed)
    model = lora_minilm(base, p.top, seed)
    layers = encoder_layers(model)
    top = MultiTaskTop(list(layers[len(layers) - p.top:]), Heads(base.config.hidden_size))
    with torch.no_grad():  # B starts at zero: move it so that the Jacobian is not trivially zero in A
        for n, prm in top.named_parameters():
            if "lora_B" in n:
                prm.normal_(0.0, 0.02)
    idx = torch.arange(min(p.batch, len(train)))
    b = {"h": train.inputs.h[idx], "mask": train.inputs.mask[idx], "topic": train.topic[idx], "flip": train.flip[idx],
         "digits": train.digits[idx]}
    balancer = MultiTaskBalancer(lora_parameters(top), len(TASKS), MultiTaskConfig())
    jac = balancer.task_gradients(torch.stack(losses(top(b["h"], b["mask"]), b))).double()
    torch.manual_seed(seed)
    ours = pcgrad(jac)
    torch.manual_seed(seed)
    theirs = torchjd_aggregator("torchjd-pcgrad")(jac)
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-300))
