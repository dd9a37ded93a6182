"""CoA-LoRA (Ye, Tang, Ngai, ICLR 2026): one shared LoRA per layer, adjusted per quantization configuration.

A quantized layer i computes

    h = Q_C(W_i) x + s * B (I_r + U_theta(c_i, position_i, kind_i)) A x,      s = lora_alpha / r

with A [r, in], B [out, r] the shared LoRA pair (PEFT's init: A Kaiming-uniform, B = 0) and U [r, r] the output of
the configuration-to-adjustment network (`coa_network.py`), shared by all layers, fed with this layer's own
configuration c_i = (b0, b1, b2, B0, B1): NormalFloat weight bits, bits of the double-quantized block scales, the
dtype of the second-level scales, and the two block sizes. U sits *between* B and A, on the rank dimension, so
U = 0 is exactly LoRA (card pitfall) and the adjustment costs r^2 outputs, not a whole LoRA.

This adapter holds the LoRA pair and the layer's current configuration (`knobs`, indices into the config's choice
lists, saved with the adapter); it does not touch the base weight. Quantizing the base per configuration is the
procedure's job (`rankwise.recipes.coa_lora`), which precomputes every option's quantized weight once and assembles
a configuration by lookup. For a given configuration the deployed form is a plain LoRA delta with factors
(A, B (I + U)), so `save` writes a PEFT folder that peft loads onto that configuration's quantized base.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters.base import Adapter, AdapterSite, LoraFactors
from rankwise.adapters.coa_network import FIELDS, adjustment, initial_value, network_shapes
from rankwise.adapters.config import AdapterConfig, name_matches
from rankwise.errors import InvalidInputError

# What the quantizers support (rankwise.quant.codebook's NormalFloat and double quantization).
SUPPORTED_BITS = (2, 3, 4, 8)
SUPPORTED_SCALE_BITS = (2, 3, 4, 8)
SUPPORTED_SCALE_DTYPES = ("bf16", "fp16", "fp32")
SUPPORTED_BLOCKS = (8, 16, 32, 64, 128, 256)
SUPPORTED_SCALE_BLOCKS = (16, 32, 64, 128, 256)
KNOBS = FIELDS[:5]  # b0, b1, b2, B0, B1

LayerOption = tuple  # (b0: int, b1: int, b2: str, B0: int, B1: int), one layer's quantization configuration


@dataclass
class CoaLoraConfig(AdapterConfig):
    """The adapter and its configuration space (the paper's: b0, b1 in {2,3,4,8}, b2 in {bf16, fp16, fp32},
    B0 in {16, 32, 64}, B1 in {16, 64, 256})."""

    method = "coa-lora"  # its key in rankwise.adapters.types.ADAPTER_TYPES

    lora_alpha: float = 16.0
    bits: list[int] = field(default_factory=lambda: [2, 3, 4, 8])
    scale_bits: list[int] = field(default_factory=lambda: [2, 3, 4, 8])
    scale_dtypes: list[str] = field(default_factory=lambda: ["bf16", "fp16", "fp32"])
    blocks: list[int] = field(default_factory=lambda: [16, 32, 64])
    scale_blocks: list[int] = field(default_factory=lambda: [16, 64, 256])
    embed_dim: int = 8  # per categorical input
    hidden: int = 128
    init_std: float = 1e-3  # of the network's last Linear (U ~ 0 at init)
    max_layers: int = 64  # size of the position embedding (layer indices must be below it)
    module_kinds: list[str] | None = None  # names of the module kinds (PEFT-style suffixes); None: target_modules

    def validate(self) -> None:
        super().validate()
        for name, supported in (("bits", SUPPORTED_BITS), ("scale_bits", SUPPORTED_SCALE_BITS),
                                ("scale_dtypes", SUPPORTED_SCALE_DTYPES), ("blocks", SUPPORTED_BLOCKS),
                                ("scale_blocks", SUPPORTED_SCALE_BLOCKS)):
            values = getattr(self, name)
            if not isinstance(values, (list, tuple)) or not values:
                raise InvalidInputError(f"coa-lora {name} must be a non-empty list drawn from {list(supported)}, got {values!r}")
            bad = [v for v in values if v not in supported or isinstance(v, bool)]
            if bad or len(set(values)) != len(values):
                raise InvalidInputError(f"coa-lora {name} must be distinct values from {list(supported)}, got {list(values)}")
        for name in ("embed_dim", "hidden", "max_layers"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"coa-lora {name} must be >= 1, got {getattr(self, name)}")
        if not self.init_std >= 0:
            raise InvalidInputError(f"coa-lora init_std must be >= 0, got {self.init_std}")
        if not self.lora_alpha > 0:
            raise InvalidInputError(f"coa-lora lora_alpha must be > 0, got {self.lora_alpha}")
        kinds = self.kinds()
        if kinds is None:
            raise InvalidInputError("coa-lora with a regex target_modules needs module_kinds: the list of module name suffixes "
                                    "whose kind the network embeds (e.g. ['query', 'value', 'intermediate.dense'])")
        if not kinds or not all(isinstance(k, str) and k for k in kinds) or len(set(kinds)) != len(kinds):
            raise InvalidInputError(f"coa-lora module_kinds must be distinct non-empty names, got {kinds!r}")

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r

    def kinds(self) -> list[str] | None:
        if self.module_kinds is not None:
            return list(self.module_kinds)
        return list(self.target_modules) if not isinstance(self.target_modules, str) else None

    def choices(self) -> tuple[tuple, ...]:
        """The choice list of each knob, in KNOBS order."""
        return (tuple(self.bits), tuple(self.scale_bits), tuple(self.scale_dtypes), tuple(self.blocks), tuple(self.scale_blocks))

    def cardinalities(self) -> tuple[int, ...]:
        """Number of values of each of the network's 7 inputs (FIELDS order)."""
        return (*(len(c) for c in self.choices()), self.max_layers, len(self.kinds() or ()))

    def knob_indices(self, option: Sequence) -> tuple[int, ...]:
        """(b0, b1, b2, B0, B1) values -> indices into the choice lists; raises InvalidInputError naming a bad value."""
        if not isinstance(option, (list, tuple)) or len(option) != len(KNOBS):
            raise InvalidInputError(f"a layer configuration is {len(KNOBS)} values (b0, b1, b2, B0, B1), got {option!r}")
        out = []
        for knob, value, allowed in zip(KNOBS, option, self.choices()):
            if value not in allowed or isinstance(value, bool):
                raise InvalidInputError(f"layer configuration {tuple(option)}: {knob}={value!r} is not supported; "
                                        f"this adapter's choices are {knob} in {list(allowed)}")
            out.append(allowed.index(value))
        return tuple(out)

    def option(self, indices: Sequence[int]) -> LayerOption:
        """Indices -> (b0, b1, b2, B0, B1) values."""
        return tuple(c[int(i)] for c, i in zip(self.choices(), indices))

    def finest_option(self) -> LayerOption:
        """The highest-precision option of the space (the adapters' configuration before one is set)."""
        return (max(self.bits), max(self.scale_bits), "fp32" if "fp32" in self.scale_dtypes else self.scale_dtypes[0],
                min(self.blocks), min(self.scale_blocks))


def module_kind(module_name: str, kinds: Sequence[str]) -> int:
    """Index of the longest entry of `kinds` that names this module (PEFT suffix rule); BERT's `output.dense` and
    `attention.output.dense` stay apart because the longer match wins."""
    matches = [i for i, k in enumerate(kinds) if name_matches(module_name, [k])]
    if not matches:
        raise InvalidInputError(f"coa-lora: module {module_name!r} matches none of module_kinds {list(kinds)}; add its kind")
    return max(matches, key=lambda i: len(kinds[i]))


class CoaLoraAdapter(Adapter):
    """A [r, in], B [out, r] trainable per layer; the network (shared); buffer `knobs` long [5] (the configuration)."""

    method = "coa-lora"
    config_class = CoaLoraConfig

    def __init__(self, site: AdapterSite, config: CoaLoraConfig, initialize: bool = True) -> None:
        super().__init__(site, config, initialize)
        r, d_in, d_out = config.r, site.in_features, site.out_features
        dtype = site.base.weight.dtype
        self.config = config
        self.r, self.scaling = r, config.scaling
        position = site.layer_index or 0
        if position >= config.max_layers:
            raise InvalidInputError(f"coa-lora: {site.module_name} is layer {position} but max_layers={config.max_layers}; "
                                    "raise max_layers")
        self.register_buffer("site_indices", torch.tensor([position, module_kind(site.module_name, config.kinds())]),
                             persistent=False)
        self.register_buffer("knobs", torch.tensor(config.knob_indices(config.finest_option())))
        shapes = network_shapes(config.cardinalities(), config.embed_dim, config.hidden, r)
        fan_in = shapes["w1"][1]
        self.net_names = tuple(shapes)
        for name, shape in shapes.items():
            p = site.shared_parameter(f"net/{name}", initial_value(name, shape, config.init_std, fan_in, dtype))
            if tuple(p.shape) != shape:
                raise InvalidInputError(f"coa-lora network tensor {name} has shape {tuple(p.shape)}, expected {shape}")
            self.use_shared(f"net_{name}", p)
        self.A = nn.Parameter(torch.empty(r, d_in, dtype=dtype))
        self.B = nn.Parameter(torch.empty(d_out, r, dtype=dtype))
        if initialize:
            self.reset()

    @torch.no_grad()
    def reset(self) -> None:
        # LoRA's (PEFT's) init and RNG order, see lora.py.
        nn.init.kaiming_uniform_(self.A, a=5 ** 0.5)
        nn.init.kaiming_uniform_(self.B, a=5 ** 0.5)
        nn.init.kaiming_uniform_(self.A, a=5 ** 0.5)
        nn.init.zeros_(self.B)

    # ---- configuration --------------------------------------------------------------------------------------------
    def set_option(self, option: Sequence) -> None:
        """Use the layer configuration (b0, b1, b2, B0, B1) (values; InvalidInputError outside the choices)."""
        self.knobs.copy_(torch.tensor(self.config.knob_indices(option)))

    @property
    def option(self) -> LayerOption:
        return self.config.option(self.knobs.tolist())

    def network_inputs(self) -> torch.Tensor:
        """The 7 indices U is computed from: long [7] (knobs, position, kind)."""
        return torch.cat([self.knobs, self.site_indices])

    def adjustment(self) -> torch.Tensor:
        """U [r, r] for this layer's current configuration."""
        params = {n: getattr(self, f"net_{n}") for n in self.net_names}
        return adjustment(params, self.network_inputs(), self.r)

    # ---- the adapter contract -------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.linear(x, self.A)  # [..., r]
        z = z + F.linear(z, self.adjustment())  # (I + U) A x; exactly A x when U = 0
        return F.linear(z, self.B) * self.scaling

    def adjusted_b(self) -> torch.Tensor:
        """B (I + U) [out, r]: the LoRA B of the current configuration."""
        return self.B + self.B @ self.adjustment()

    def delta_weight(self) -> torch.Tensor:
        return self.adjusted_b() @ self.A * self.scaling

    def lora_factors(self) -> LoraFactors:
        with torch.no_grad():
            return LoraFactors(self.A.detach().clone(), self.adjusted_b().detach().contiguous(), self.scaling)
