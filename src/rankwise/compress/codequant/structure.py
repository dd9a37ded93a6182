"""Where CodeQuant's pieces sit in a decoder: the residual-stream readers and writers of each block.

Works on Llama-style causal LMs (`model.model.layers[i]` with `input_layernorm`, `self_attn.{q,k,v,o}_proj`,
`post_attention_layernorm` and an `mlp`), as `transformers` builds SmolLM2 and as rankwise's small MoE is laid out.
The `mlp` is either dense (`gate_proj`, `up_proj`, `down_proj`: one expert, no router) or a mixture of experts with
a router `mlp.gate` (an nn.Linear whose outputs are the router logits) and `mlp.experts`, a list of such experts.
`transformers` MoE models that store their experts as fused 3-D parameters have no per-expert linears to cluster
and are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class Expert:
    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear


@dataclass(frozen=True)
class Block:
    """One decoder layer's residual-stream interface. `router` is None for a dense MLP (one expert)."""

    index: int
    input_norm: nn.Module
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    post_norm: nn.Module
    mlp: nn.Module
    router: nn.Linear | None
    experts: tuple[Expert, ...]

    @property
    def attention_readers(self) -> tuple[nn.Linear, ...]:
        return (self.q_proj, self.k_proj, self.v_proj)

    @property
    def mlp_readers(self) -> tuple[nn.Linear, ...]:
        """The linears that read post_norm's output: the router and every expert's gate and up projections."""
        inner = tuple(p for e in self.experts for p in (e.gate_proj, e.up_proj))
        return ((self.router,) + inner) if self.router is not None else inner

    @property
    def writers(self) -> tuple[nn.Linear, ...]:
        return (self.o_proj,) + tuple(e.down_proj for e in self.experts)


@dataclass(frozen=True)
class Decoder:
    embed: nn.Embedding
    blocks: tuple[Block, ...]
    final_norm: nn.Module
    lm_head: nn.Linear

    @property
    def hidden_size(self) -> int:
        return self.embed.weight.shape[1]

    @property
    def is_moe(self) -> bool:
        return any(b.router is not None for b in self.blocks)


def _linear(module: nn.Module, name: str, where: str) -> nn.Linear:
    child = getattr(module, name, None)
    # an nn.Linear, or a quantized stand-in for one (after the swap: rankwise's RoundedLinear / ClusteredLinear)
    if not isinstance(child, nn.Module) or not all(hasattr(child, a) for a in ("in_features", "out_features")):
        raise InvalidInputError(f"{where}.{name} is {type(child).__name__}, not an nn.Linear: CodeQuant needs a "
                                "Llama-style decoder (q/k/v/o projections, gate/up/down experts)")
    return child


def _expert(module: nn.Module, where: str) -> Expert:
    return Expert(*(_linear(module, n, where) for n in ("gate_proj", "up_proj", "down_proj")))


def _block(i: int, layer: nn.Module) -> Block:
    where = f"model.layers.{i}"
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or not hasattr(layer, "input_layernorm") or not hasattr(layer, "post_attention_layernorm"):
        raise InvalidInputError(f"{where} lacks self_attn / mlp / input_layernorm / post_attention_layernorm: not a "
                                "Llama-style decoder layer")
    q, k, v, o = (_linear(attn, n, f"{where}.self_attn") for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    if hasattr(mlp, "experts"):
        experts = getattr(mlp, "experts")
        if not isinstance(experts, nn.ModuleList):
            raise InvalidInputError(f"{where}.mlp.experts is {type(experts).__name__} (fused expert weights?), not a "
                                    "list of per-expert linears: CodeQuant clusters each expert's linears separately")
        router = _linear(mlp, "gate", f"{where}.mlp")
        group = tuple(_expert(e, f"{where}.mlp.experts.{j}") for j, e in enumerate(experts))
    else:
        router, group = None, (_expert(mlp, f"{where}.mlp"),)
    return Block(i, layer.input_layernorm, q, k, v, o, layer.post_attention_layernorm, mlp, router, group)


def decoder_of(model: nn.Module) -> Decoder:
    """The residual-stream map of a Llama-style causal LM; refuses anything else before any work."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(inner, "embed_tokens") or not hasattr(inner, "norm"):
        raise InvalidInputError(f"{type(model).__name__} is not a Llama-style causal LM (model.model.layers, "
                                "embed_tokens, norm): CodeQuant quantizes decoders such as SmolLM2 or an MoE laid out "
                                "the same way")
    head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Linear):
        raise InvalidInputError(f"{type(model).__name__} has no lm_head linear: CodeQuant needs a causal LM")
    return Decoder(inner.embed_tokens, tuple(_block(i, layer) for i, layer in enumerate(layers)), inner.norm, head)


def require_moe(decoder: Decoder, what: str) -> None:
    if not decoder.is_moe:
        raise InvalidInputError(f"{what} needs a mixture-of-experts model (a router mlp.gate and mlp.experts); this "
                                "model's MLPs are dense")
