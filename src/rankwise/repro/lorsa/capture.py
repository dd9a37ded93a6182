"""Capture one attention layer's input and output in a HF Llama-family model (SmolLM2), and its exact Lorsa form.

X = the attention input after the layer's pre-norm (`model.layers.L.input_layernorm`'s output), Y = the attention
output after o_proj and before the residual add (`model.layers.L.self_attn.o_proj`'s output). The forward stops right
after layer L's attention: the later layers do not change what is captured.
"""

from __future__ import annotations

import torch

from rankwise.core.calibration import input_hooks
from rankwise.core.progress import progress
from rankwise.nn.lorsa import Lorsa, Rope, lorsa_from_attention


class _Stop(Exception):
    """Raised by the hook once layer L's output is captured, to skip the rest of the forward."""


def hook_names(layer: int) -> tuple[str, str]:
    return f"model.layers.{layer}.input_layernorm", f"model.layers.{layer}.self_attn.o_proj"


@torch.no_grad()
def capture_attention(model, windows: torch.Tensor, layer: int, batch: int = 8,
                      desc: str = "capture") -> tuple[torch.Tensor, torch.Tensor]:
    """windows [N, T] token ids -> (X [N, T, d], Y [N, T, d]) fp32 at attention layer `layer`."""
    x_name, y_name = hook_names(layer)
    got: dict[str, torch.Tensor] = {}

    def on(name, module, inputs, output):
        got[name] = output.detach().float()
        if name == y_name:
            raise _Stop

    xs, ys = [], []
    with input_hooks(model, [x_name, y_name], on):
        for i in progress(range(0, windows.size(0), batch), desc=desc):
            try:
                model(input_ids=windows[i:i + batch])
            except _Stop:
                pass
            xs.append(got.pop(x_name))
            ys.append(got.pop(y_name))
    return torch.cat(xs), torch.cat(ys)


def rope_of(config) -> Rope:
    """The target model's RoPE (HF Llama: full head dim, 'half' pairing, its theta)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return Rope(int(head_dim), float(theta), "half")


def exact_lorsa(model, layer: int) -> Lorsa:
    """Layer `layer`'s attention written exactly as a Lorsa (K = every rank-1 OV piece)."""
    attn = model.model.layers[layer].self_attn
    c = model.config
    b = lambda lin: None if lin.bias is None else lin.bias.detach()  # noqa: E731
    return lorsa_from_attention(attn.q_proj.weight.detach(), attn.k_proj.weight.detach(), attn.v_proj.weight.detach(),
                                attn.o_proj.weight.detach(), c.num_attention_heads, c.num_key_value_heads, rope_of(c),
                                attn_scale=float(attn.scaling), q_bias=b(attn.q_proj), k_bias=b(attn.k_proj),
                                v_bias=b(attn.v_proj), o_bias=b(attn.o_proj))
