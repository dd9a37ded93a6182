"""Optimizers and training rules."""

from rankwise.optim.galore import galore_adamw
from rankwise.optim.lora_pre import LoRAPre, is_factored
from rankwise.optim.lora_pre_muon import LoRAPreMuon
from rankwise.optim.low_rank_regression import gamma_for_beta, newton_factor_step_
from rankwise.optim.newton_schulz import newton_schulz5
from rankwise.optim.param_groups import low_rank_param_groups, split_low_rank_params
from rankwise.optim.state_memory import optimizer_state_bytes

__all__ = [
    "LoRAPre", "LoRAPreMuon", "is_factored", "gamma_for_beta", "newton_factor_step_", "newton_schulz5", "galore_adamw",
    "low_rank_param_groups", "split_low_rank_params", "optimizer_state_bytes",
]
