"""Which models can be converted, where their K/V projections are, and what a latent KV cache would cost.

Supported: Llama-family decoder models in `transformers` (model_type llama or mistral: GQA or MHA attention with
`self_attn.k_proj` / `self_attn.v_proj` linears fed by the same RMS-normed input, RoPE applied after them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rankwise.compress.mla.modules import LowRankLinear
from rankwise.errors import InvalidInputError

SUPPORTED_MODEL_TYPES = ("llama", "mistral")
FORMAT = "mla-oneshot"  # config.json's "rankwise_format" for converted models
CONFIG_KEY = "rankwise_mla"  # config.json entry holding the per-layer ranks and how they were made


@dataclass(frozen=True)
class KVLayout:
    """Shapes of a Llama-family attention: kv_width = num_kv_heads * head_dim is the full (parity) rank r."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise InvalidInputError(f"{type(model).__name__} has no `model.layers`; pass a Llama-family causal LM (e.g. load_model('smollm2-135m'))")
    return layers


def kv_layout(model: nn.Module, allow_converted: bool = False) -> KVLayout:
    """Validate that `model` is a convertible Llama-family GQA/MHA model and return its attention shapes."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InvalidInputError(
            f"MLA conversion supports Llama-family GQA/MHA models ({', '.join(SUPPORTED_MODEL_TYPES)}), got model_type {model_type!r}"
        )
    layers = decoder_layers(model)
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    if num_heads % num_kv_heads:
        raise InvalidInputError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
    layout = KVLayout(len(layers), config.hidden_size, num_heads, num_kv_heads, head_dim)
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        for name in ("k_proj", "v_proj"):
            proj = getattr(attn, name, None)
            if isinstance(proj, LowRankLinear) and not allow_converted:
                raise InvalidInputError(f"layer {i} is already converted to MLA; convert the original model instead")
            if not isinstance(proj, (nn.Linear, LowRankLinear)):
                raise InvalidInputError(f"layer {i} has no linear self_attn.{name}; this attention is not Llama-style GQA/MHA")
            if (proj.in_features, proj.out_features) != (layout.hidden_size, layout.kv_width):
                raise InvalidInputError(
                    f"layer {i} {name} maps {proj.in_features} -> {proj.out_features}, expected {layout.hidden_size} -> {layout.kv_width}"
                )
    return layout


def k_proj_names(model: nn.Module) -> list[str]:
    """Module names of every layer's k_proj. Its input is also v_proj's, so one second moment serves both."""
    names = {module: name for name, module in model.named_modules()}
    return [names[layer.self_attn.k_proj] for layer in decoder_layers(model)]


def dense_kv_weights(model: nn.Module, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_K, W_V), each [kv_width, D] float64 (torch layout), of one layer (dense or already factored)."""
    attn = decoder_layers(model)[layer].self_attn
    return attn.k_proj.weight.detach().double(), attn.v_proj.weight.detach().double()


def mla_info(model: nn.Module) -> dict | None:
    """The conversion record stored on a converted model's config (None for an unconverted model)."""
    config = getattr(model, "config", None)
    if getattr(config, "rankwise_format", None) != FORMAT:
        return None
    return getattr(config, CONFIG_KEY, None)


def latent_kv_elements_per_token(model: nn.Module) -> int:
    """Numbers per token a latent KV cache of this model would hold: sum over layers of r_K + r_V (joint: r_KV).

    For an unconverted model that is the plain GQA cache, 2 * layers * kv_width.
    """
    info = mla_info(model)
    if info is None:
        layout = kv_layout(model)
        return 2 * layout.num_layers * layout.kv_width
    if info["joint"]:
        return sum(info["k_ranks"])  # one shared latent per layer; k_ranks == v_ranks == its width
    return sum(info["k_ranks"]) + sum(info["v_ranks"])


def kv_saving(model: nn.Module) -> float:
    """1 - latent cache size / original GQA cache size (e.g. 0.75 at r = kv_width / 4 per matrix)."""
    layout = kv_layout(model, allow_converted=True)
    return 1.0 - latent_kv_elements_per_token(model) / (2 * layout.num_layers * layout.kv_width)
