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

How to add a method (e.g. `guardspace.py`):
1. `@dataclass class MyConfig(AdapterConfig)` with `method = "mymethod"` and the method's settings (r,
   target_modules, layers_to_transform are inherited; override `validate` to check yours).
2. `class MyAdapter(Adapter)` with `method = "mymethod"`, `config_class = MyConfig` and
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
3. Add `"mymethod": MyAdapter` to the table `ADAPTER_TYPES` in `types.py`. Then the loader knows it and
   `rankwise finetune --method mymethod` offers it (the CLI builds the config from --rank/--targets with
   `factory.adapt`).
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
