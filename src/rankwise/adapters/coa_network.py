"""CoA-LoRA's configuration-to-adjustment network U_theta: one layer's quantization configuration -> an r x r matrix.

Inputs per layer are 7 categorical indices: the 5 quantization knobs (weight bits b0, scale bits b1, second-level
scale dtype b2, block size B0, scale block size B1), the layer's position in the stack and its module kind. Each goes
through its own embedding table [n_k, E]; the 7 embeddings are concatenated (7E) -> LayerNorm -> Linear(7E, H) ->
SiLU -> Linear(H, r^2) -> reshape [r, r] -> U = scale * out, with a learnable scalar `scale` (init 1). The last
Linear starts at N(0, init_std) weights and zero bias, so U ~ 0 and training starts from plain LoRA (card pitfall: a
random r x r at init destroys the shared LoRA). With the last layer zeroed, U is exactly 0.

The network is shared by all layers of one adapter: its tensors live in the model's `SharedParameters` (saved once,
as `shared/net/<name>`), and this module only computes with them. A layer's U depends on that layer's 7 indices and
nothing else (layer-wise independence, tested).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

FIELDS = ("b0", "b1", "b2", "B0", "B1", "position", "kind")  # the 7 categorical inputs, in order


def network_shapes(cardinalities: Sequence[int], embed_dim: int, hidden: int, r: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the network for `cardinalities` (one per FIELDS entry)."""
    width = len(FIELDS) * embed_dim
    shapes: dict[str, tuple[int, ...]] = {f"emb_{f}": (n, embed_dim) for f, n in zip(FIELDS, cardinalities)}
    shapes.update({"ln_weight": (width,), "ln_bias": (width,), "w1": (hidden, width), "b1": (hidden,),
                   "w2": (r * r, hidden), "b2": (r * r,), "scale": (1,)})
    return shapes


def initial_value(name: str, shape: tuple[int, ...], init_std: float, fan_in: int, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """A factory of the initial tensor `name` (draws from torch's global RNG, as nn.Embedding / nn.Linear do);
    `fan_in` is the first Linear's input width (for its bias bound, as nn.Linear sets it)."""

    def make() -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        if name.startswith("emb_"):
            nn.init.normal_(t)  # nn.Embedding's default
        elif name == "ln_weight" or name == "scale":
            nn.init.ones_(t)
        elif name in ("ln_bias", "b2"):
            nn.init.zeros_(t)
        elif name == "w1":
            nn.init.kaiming_uniform_(t, a=math.sqrt(5))  # nn.Linear's default
        elif name == "b1":
            nn.init.uniform_(t, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))
        elif name == "w2":
            nn.init.normal_(t, std=init_std)  # near zero: U ~ 0 at init
        return t

    return make


def adjustment(params: dict[str, torch.Tensor], indices: torch.Tensor, r: int) -> torch.Tensor:
    """U [r, r] for one layer from its 7 indices (long [7], in FIELDS order)."""
    emb = torch.cat([params[f"emb_{f}"][indices[i]] for i, f in enumerate(FIELDS)])  # [7E]
    h = F.layer_norm(emb, emb.shape, params["ln_weight"], params["ln_bias"])
    h = F.silu(F.linear(h, params["w1"], params["b1"]))
    out = F.linear(h, params["w2"], params["b2"])  # [r^2]
    return params["scale"] * out.reshape(r, r)
