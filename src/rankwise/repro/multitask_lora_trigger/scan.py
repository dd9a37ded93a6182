"""The trigger scan of the reproduction: every adapter (clean or canary) loaded in turn into one scanning model
(MiniLM with LoRA slots on the same layers, plus the heads) and scanned with `rankwise.adapters.trigger_scan`
against the same model with its adapter disabled."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.adapters.trigger_scan import ScanConfig, TriggerScan, trigger_scan
from rankwise.repro.multitask_lora_trigger.model import Heads, TopicClassifier, lora_minilm


class Scanner:
    """One scanning model; `scan(state)` loads an adapter's tensors (`train.adapter_state`) and scans it."""

    def __init__(self, base: nn.Module, top: int, tokenizer, prompts: list[str], candidates: list[str],
                 config: ScanConfig) -> None:
        self.model = lora_minilm(base, top, 0).eval()
        self.heads = Heads(base.config.hidden_size).eval()
        self.tokenizer, self.prompts, self.candidates, self.config = tokenizer, prompts, candidates, config
        self._params = dict(self.model.named_parameters())

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        for name, t in state.items():
            if not name.startswith("heads."):
                self._params[name].copy_(t)
        self.heads.load_state_dict({n[len("heads."):]: t for n, t in state.items() if n.startswith("heads.")})

    def scan(self, state: dict[str, torch.Tensor]) -> TriggerScan:
        self.load(state)
        base = TopicClassifier(self.model, self.heads, adapter_on=False)
        adapted = TopicClassifier(self.model, self.heads, adapter_on=True)
        return trigger_scan(base, adapted, self.tokenizer, self.prompts, self.candidates, self.config)
