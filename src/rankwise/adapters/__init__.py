"""Adapters: PEFT-style parameter-efficient fine-tuning on any model's `nn.Linear` layers.

    from rankwise.adapters import LoraConfig, PicaConfig, add_adapter, load_adapter
    model = add_adapter(base, PicaConfig(r=8, target_modules=["q_proj", "v_proj"], layers_to_transform=[28, 29]))
    ...train...
    model.save("out/adapter")                       # peft.PeftModel.from_pretrained(base, "out/adapter") loads it
    model = load_adapter(fresh_base, "out/adapter") # exact round trip

Files: `config.py` (AdapterConfig, target selection), `base.py` (Adapter, AdaptedLinear, the type registry),
`model.py` (AdaptedModel: add/set/disable/delete, merge, counts), `peft_format.py` (save/load), one file per method.

How to add a method (e.g. `guardspace.py`):
1. `@dataclass class MyConfig(AdapterConfig)` with the method's settings (r, target_modules, layers_to_transform are
   inherited; override `validate` to check yours).
2. `@register_adapter("mymethod") class MyAdapter(Adapter)` with `config_class = MyConfig` and
   - `__init__(self, site, config, initialize=True)`: call super(), create parameters (trainable) and buffers
     (frozen, saved) from `site.base.weight`; if `initialize`, compute their initial values. Set
     `needs_statistics = True` to receive `site.statistics` (a `SecondMoment` of the layer input from
     `rankwise.core.calibration.collect_second_moments`), passed as `add_adapter(..., statistics=...)`.
     Use `site.shared_parameter(key, factory)` + `self.use_shared(attr, param)` for a parameter shared by layers.
   - `forward(x)`: the delta output [..., out] added to the unchanged base output. A method that "modifies the
     frozen weight" (PiSSA, GuardSpace's W' = W - B0 A0 P) subtracts its initial contribution here instead, so
     disable/merge/delete stay exact.
   - `delta_weight()`: [out, in], consistent with forward (merge adds it).
   - `lora_factors()`: `LoraFactors(A, B, scaling)` with scaling * B @ A == delta_weight(), for PEFT export.
3. Nothing else to edit: `discover_adapter_types()` imports every module of this package, so the type registers
   itself and `rankwise finetune --method mymethod` offers it (the CLI builds the config from --rank/--targets;
   see `rankwise.training.methods`).
"""

from rankwise.adapters.base import (
    ADAPTER_TYPES, AdaptedLinear, Adapter, AdapterSite, LoraFactors, SharedParameters, adapter_type, discover_adapter_types,
    register_adapter,
)
from rankwise.adapters.config import AdapterConfig, find_targets, layer_index, module_type
from rankwise.adapters.lora import LoraAdapter, LoraConfig
from rankwise.adapters.model import AdaptedModel, ParameterCount, add_adapter
from rankwise.adapters.peft_format import load_adapter, save_adapter
from rankwise.adapters.pica import PicaAdapter, PicaConfig

__all__ = [
    "ADAPTER_TYPES", "AdaptedLinear", "Adapter", "AdapterSite", "LoraFactors", "SharedParameters", "adapter_type",
    "discover_adapter_types",
    "register_adapter", "AdapterConfig", "find_targets", "layer_index", "module_type", "LoraAdapter", "LoraConfig",
    "AdaptedModel", "ParameterCount", "add_adapter", "load_adapter", "save_adapter", "PicaAdapter", "PicaConfig",
]
