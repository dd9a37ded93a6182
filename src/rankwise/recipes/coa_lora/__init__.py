"""CoA-LoRA's training machinery around the `coa-lora` adapter: the configuration space, the bank of precomputed
quantized base weights, the configuration-set search and per-configuration export.

    space = space_for(model, choices)          # knob values per layer option
    bank = QuantizedBank(model, space)         # every (layer, option) quantized once
    bank.apply(config)                          # the base quantized per config, adapters told the config
    search = ConfigurationSearch(space, ilp_pool(space, bank.errors, budgets), seed)
    export_configuration(adapted, bank, config, folder)   # a PEFT folder for that config's quantized base

The training procedure (`rankwise finetune --procedure coa-lora`) is `rankwise.recipes.coa_lora.procedure`.
"""

from rankwise.recipes.coa_lora.bank import QuantizedBank, adapted_layers, space_for
from rankwise.recipes.coa_lora.deploy import export_configuration, quantized_base_weights
from rankwise.recipes.coa_lora.search import ConfigurationSearch, ilp_pool, stream_seed
from rankwise.recipes.coa_lora.space import ConfigSpace, recipe_of

__all__ = ["QuantizedBank", "adapted_layers", "space_for", "export_configuration", "quantized_base_weights",
           "ConfigurationSearch", "ilp_pool", "stream_seed", "ConfigSpace", "recipe_of"]
