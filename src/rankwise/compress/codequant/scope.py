"""Which linears CodeQuant quantizes, and swapping them in place.

The released evaluation's scope, kept here: the readers of the (rotated) residual stream, i.e. q/k/v, the router and
every expert's gate/up projections, get 4-bit weights and per-token 4-bit inputs; o_proj and down_proj stay FP (the
card: "o_proj and down_proj stay BF16"). The readers of one norm share one input, so they are grouped (`ReaderGroup`)
for the baselines that use the input statistics (SmoothQuant's channel maxima, GPTQ's Hessian).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from rankwise.compress.codequant.structure import Decoder


@dataclass(frozen=True)
class ReaderGroup:
    """The linears reading one norm's output: `norm`, and `linears` as (qualified name, module) pairs."""

    name: str  # "layers.{i}.attention" or "layers.{i}.mlp"
    norm: nn.Module
    linears: tuple[tuple[str, nn.Linear], ...]


def reader_groups(model: nn.Module, decoder: Decoder) -> list[ReaderGroup]:
    names = {id(m): n for n, m in model.named_modules()}
    groups = []
    for b in decoder.blocks:
        groups.append(ReaderGroup(f"layers.{b.index}.attention", b.input_norm,
                                  tuple((names[id(m)], m) for m in b.attention_readers)))
        groups.append(ReaderGroup(f"layers.{b.index}.mlp", b.post_norm, tuple((names[id(m)], m) for m in b.mlp_readers)))
    return groups


def replace_module_(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` at the dotted path `name` of `model` (in place)."""
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(parent, (nn.ModuleList, nn.Sequential)) and leaf.isdigit():
        parent[int(leaf)] = new
    else:
        setattr(parent, leaf, new)
