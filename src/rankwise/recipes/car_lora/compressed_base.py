"""CAR-LoRA's compressed base: the frozen weights of some transformer blocks under each compression operator,
precomputed once and switched in and out (per micro-batch during training, per evaluation afterwards).

    base = CompressedBase(adapted, parse_operators("int8,nf4,fp4,prune,skip"))   # blocks holding adapters
    with base.using("nf4"):
        loss = task.loss(module, batch)             # h = Q(W₀) x + s B A x in every compressed block
    base.original_hash() == hash_before             # θ₀ itself is never written

How each operator acts (see `rankwise.quant.compression_ops`): a quantizer swaps each base `nn.Linear` weight's storage for its
precomputed quantized copy (the Parameter object and θ₀'s tensor are kept; restoring swaps θ₀ back); pruning adds
hooks that zero the pruned MLP channels at the producers' outputs and the consumer's input, so base *and* adapter are
masked; skipping replaces the chosen blocks' forward by the identity on the hidden state, so their adapters are
skipped too. Because θ₀ is frozen, the quantized forward needs no straight-through estimator: gradients with respect
to the adapter factors treat Q(W₀) as the constant it is.

Modules are looked up by name when an operator is applied, so adapters may be added and deleted between uses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rankwise.adapters.base import AdaptedLinear
from rankwise.quant.compression_ops import MLP_LAYOUTS, CompressionOperator, get_operator, prune_mask
from rankwise.core.layer_names import DEFAULT_LAYER_PATTERNS
from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError, UnknownNameError


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's stack of repeated blocks: the first `nn.ModuleList` named like PEFT's layer patterns."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in DEFAULT_LAYER_PATTERNS and len(module):
            return name, module
    raise InvalidInputError(f"{type(model).__name__} has no block stack (an nn.ModuleList named one of "
                            f"{DEFAULT_LAYER_PATTERNS}): compression operators act on transformer blocks")


def adapted_block_indices(blocks: nn.ModuleList) -> list[int]:
    """Indices of the blocks that hold at least one AdaptedLinear."""
    return [i for i, b in enumerate(blocks) if any(isinstance(m, AdaptedLinear) for m in b.modules())]


def _base_linears(block: nn.Module) -> dict[str, nn.Linear]:
    """Relative name (as the unadapted model names it) -> the frozen base nn.Linear, for every linear of a block."""
    out: dict[str, nn.Linear] = {}
    for name, m in block.named_modules():
        if isinstance(m, AdaptedLinear):
            out[name] = m.base_layer
        elif isinstance(m, nn.Linear) and not name.endswith(".base_layer") and name != "base_layer":
            out[name] = m
    return out


def _mlp_layout(model: nn.Module, block: nn.Module) -> tuple[tuple[str, ...], str]:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in MLP_LAYOUTS:
        return MLP_LAYOUTS[model_type]
    names = set(_base_linears(block))
    for layout in MLP_LAYOUTS.values():
        if set(layout[0]) | {layout[1]} <= names:
            return layout
    raise InvalidInputError(f"cannot find the MLP of a {type(block).__name__} block (known layouts: "
                            f"{dict(MLP_LAYOUTS)}); pass mlp_layout=(producers, consumer)")


class CompressedBase:
    """The compressed forms of the base weights of blocks `layers` of `model` under `operators`.

    layers: block indices to compress (default: those holding adapters). skip_layers: the blocks `skip` removes
    (default: the middle one of `layers`). mlp_layout: (producer names, consumer name) inside a block, for pruning.
    """

    def __init__(self, model: nn.Module, operators: Sequence[CompressionOperator | str], layers: Sequence[int] | None = None,
                 skip_layers: Sequence[int] | None = None, mlp_layout: tuple[Sequence[str], str] | None = None) -> None:
        ops = [get_operator(o) if isinstance(o, str) else o for o in operators]
        if not ops:
            raise InvalidInputError("CompressedBase needs at least one operator")
        self.operators: dict[str, CompressionOperator] = {"identity": get_operator("identity"), **{o.name: o for o in ops}}
        self.model = model
        self.stack_name, self.blocks = find_blocks(model)
        n = len(self.blocks)
        self.layers = sorted(set(layers)) if layers is not None else adapted_block_indices(self.blocks)
        if not self.layers:
            raise InvalidInputError("no block to compress: the model holds no adapter; pass layers=[...] explicitly")
        bad = [i for i in self.layers if not (isinstance(i, int) and 0 <= i < n)]
        if bad:
            raise InvalidInputError(f"layers {bad} are not block indices 0..{n - 1}")
        self.skip_layers = sorted(set(skip_layers)) if skip_layers is not None else [self.layers[len(self.layers) // 2]]
        if any(i not in self.layers for i in self.skip_layers):
            raise InvalidInputError(f"skip_layers {self.skip_layers} must lie among the compressed layers {self.layers} "
                                    "(a block below them would change the cached input of the adapted ones)")
        # θ₀: the weight tensors themselves (never written), by (block, relative name)
        self._params: dict[tuple[int, str], nn.Parameter] = {}
        for i in self.layers:
            for rel, linear in _base_linears(self.blocks[i]).items():
                self._params[(i, rel)] = linear.weight
        self._original = {k: p.data for k, p in self._params.items()}
        self._copies: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
        self._masks: dict[str, dict[int, torch.Tensor]] = {}
        self._layout = None
        if any(o.kind == "prune" for o in ops):
            layout = mlp_layout or _mlp_layout(model, self.blocks[self.layers[0]])
            self._layout = (tuple(layout[0]), layout[1])
        self._precompute([o for o in ops if o.kind in ("quant", "prune")])
        self._hooks: list[Any] = []
        self._skipped: list[nn.Module] = []
        self._skip_output: dict[int, str] = {}  # block index -> "tensor" | "tuple", learnt from a normal forward
        self.active = "identity"

    # ---- building -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _precompute(self, ops: list[CompressionOperator]) -> None:
        for op in progress(ops, desc="compress base"):
            if op.kind == "quant":
                self._copies[op.name] = {k: op.compress_weight(w) for k, w in self._original.items()}
            else:
                producers, _ = self._layout
                self._masks[op.name] = {i: prune_mask([self._original[(i, p)] for p in producers], op.ratio) for i in self.layers}

    @property
    def names(self) -> list[str]:
        """Operator names this base can apply (identity first)."""
        return list(self.operators)

    def original_hash(self) -> str:
        """SHA-256 of θ₀ (the original weights of the compressed blocks), to check they are never modified."""
        h = hashlib.sha256()
        for key in sorted(self._original):
            h.update(repr(key).encode())
            h.update(self._original[key].detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    def weight(self, op: str, layer: int, name: str) -> torch.Tensor:
        """The base weight [out, in] of block `layer`'s linear `name` under operator `op` (without masks)."""
        self._operator(op)
        return self._copies.get(op, self._original)[(layer, name)]

    def mask(self, op: str, layer: int) -> torch.Tensor:
        """The keep-mask [d_ff] of a pruning operator in block `layer`."""
        if op not in self._masks:
            raise InvalidInputError(f"operator {op!r} is not a pruning operator of this base")
        return self._masks[op][layer]

    def _operator(self, name: str) -> CompressionOperator:
        if name not in self.operators:
            raise UnknownNameError(f"operator {name!r} is not in this compressed base; it has {self.names}")
        return self.operators[name]

    # ---- switching ----------------------------------------------------------------------------------------------
    def apply(self, name: str) -> None:
        """Make the model compute with operator `name`'s base (identity: θ₀ itself)."""
        op = self._operator(name)
        self._clear()
        if op.kind == "quant":
            copies = self._copies[name]
            for k, p in self._params.items():
                p.data = copies[k]
        elif op.kind == "prune":
            self._install_masks(self._masks[name])
        elif op.kind == "skip":
            for i in self.skip_layers:
                self._skip(i)
        self.active = name

    def restore(self) -> None:
        """Back to θ₀ (no hooks, no skipped block)."""
        self.apply("identity")

    @contextmanager
    def using(self, name: str) -> Iterator[None]:
        before = self.active
        self.apply(name)
        try:
            yield
        finally:
            self.apply(before)

    def _clear(self) -> None:
        for k, p in self._params.items():
            p.data = self._original[k]
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for block in self._skipped:
            del block.forward  # the instance attribute set by _skip; the class's forward shows through again
        self._skipped.clear()

    def _install_masks(self, masks: dict[int, torch.Tensor]) -> None:
        producers, consumer = self._layout
        for i, mask in masks.items():
            block = self.blocks[i]

            def zero_output(_m: nn.Module, _inp: Any, out: torch.Tensor, mask: torch.Tensor = mask) -> torch.Tensor:
                return out * mask  # M_row (W₀ + s B A) x: pruned outputs are exactly 0

            def zero_input(_m: nn.Module, inp: tuple, mask: torch.Tensor = mask) -> tuple:
                return (inp[0] * mask, *inp[1:])  # (W₀ + s B A) M_col x: nothing reads a pruned channel

            for p in producers:
                self._hooks.append(block.get_submodule(p).register_forward_hook(zero_output))
            self._hooks.append(block.get_submodule(consumer).register_forward_pre_hook(zero_input))

    def _skip(self, i: int) -> None:
        block = self.blocks[i]
        original = type(block).forward.__get__(block)

        def skipped(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            kind = self._skip_output.get(i)
            if kind is None:  # learn once whether the block returns a tensor or a tuple (Llama vs BERT layers)
                with torch.no_grad():
                    out = original(hidden_states, *args, **kwargs)
                kind = self._skip_output[i] = "tensor" if torch.is_tensor(out) else "tuple"
            return hidden_states if kind == "tensor" else (hidden_states,)

        block.forward = skipped
        self._skipped.append(block)
