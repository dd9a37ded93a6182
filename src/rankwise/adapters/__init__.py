"""Adapters: PEFT-style parameter-efficient fine-tuning on any model's `nn.Linear` layers.

    from rankwise.adapters import LoraConfig, PicaConfig, add_adapter, load_adapter
    model = add_adapter(base, PicaConfig(r=8, target_modules=["q_proj", "v_proj"], layers_to_transform=[28, 29]))
    ...train...
    model.save("out/adapter")                       # peft.PeftModel.from_pretrained(base, "out/adapter") loads it
    model = load_adapter(fresh_base, "out/adapter") # exact round trip

Files: `config.py` (AdapterConfig, target selection), `base.py` (Adapter, AdaptedLinear),
`types.py` (the table of adapter types by method name), `model.py` (AdaptedModel: add/set/disable/delete, merge,
counts, save, `load_adapter`), `peft_format.py` (the saved folder: writer and reader), `factory.py` (method name +
rank + targets -> adapted model), one file per method.

How to add an adapter method: CONTRIBUTING.md (one copy of each how-to).
"""

from rankwise.adapters.base import AdaptedLinear, Adapter, AdapterSite, LoraFactors, SharedParameters
from rankwise.adapters.config import AdapterConfig, find_targets, layer_index, module_type
from rankwise.adapters.factory import DEFAULT_TARGETS, adapt, available_methods, build_config, default_targets, top_layers
from rankwise.adapters.guardspace import GuardSpaceAdapter, GuardSpaceConfig
from rankwise.adapters.lora import LoraAdapter, LoraConfig
from rankwise.adapters.model import AdaptedModel, ParameterCount, add_adapter, load_adapter
from rankwise.adapters.peft_format import save_adapter
from rankwise.adapters.pica import PicaAdapter, PicaConfig
from rankwise.adapters.types import ADAPTER_TYPES, adapter_type

__all__ = [
    "ADAPTER_TYPES", "AdaptedLinear", "Adapter", "AdapterSite", "LoraFactors", "SharedParameters", "adapter_type",
    "AdapterConfig", "find_targets", "layer_index", "module_type", "LoraAdapter", "LoraConfig",
    "AdaptedModel", "ParameterCount", "add_adapter", "load_adapter", "save_adapter", "PicaAdapter", "PicaConfig",
    "GuardSpaceAdapter", "GuardSpaceConfig",
    "DEFAULT_TARGETS", "adapt", "available_methods", "build_config", "default_targets", "top_layers",
]
