"""Which layers of a user's model DFA trains, and how they chain for feedback-weight matching.

- The output layer: the nn.Linear named by `head`, else the module's top-level `head`, else the nn.Linear the loss
  calls last.
- The hidden DFA layers: every other nn.Linear whose weight is trainable and that the loss reaches (found by one
  probe forward on two training examples, walking its autograd graph without a backward), in the order the forward
  calls them; or exactly the modules named by `layers` (each must be an nn.Linear the loss reaches).
- An elementwise activation module right after a DFA layer in an nn.Sequential (ReLU, Tanh, Sigmoid, GELU, SiLU)
  is fused into it, so its update carries g'(a_l); a layer followed by anything else (a functional activation, a
  norm, a residual sum) receives F_l e at its own output, as if g were the identity there.
- The chain for matching: walking down from the output layer through the DFA layers in call order while each one's
  out_features equals the next one's in_features (`match_depth` caps its length). In a plain feed-forward stack it
  is the whole network; across residual blocks it is a reading of ours (the card matches a transformer's MLP
  blocks and classifier only: restrict it with `match_depth` or `layers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rankwise.errors import InvalidInputError

FUSABLE: dict[type[nn.Module], str] = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.SiLU: "silu"}


def activation_of(module: nn.Module) -> str | None:
    """The fusable activation name of `module`, or None."""
    if isinstance(module, nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    for cls, name in FUSABLE.items():
        if type(module) is cls:
            return name
    return None


@dataclass
class Site:
    """One hidden DFA layer: its module name, the nn.Linear, the fused activation (and the module it replaces)."""

    name: str
    linear: nn.Linear
    activation: str = "identity"
    activation_path: tuple[nn.Sequential, int] | None = None  # (parent Sequential, index) of the fused activation
    activation_module: nn.Module | None = None


@dataclass
class Probe:
    """What one forward of the loss on a small batch shows: the linears it reaches (ids of their weights), the order
    it calls the nn.Linear modules in, and each call's input and output shapes."""

    reached: set[int] = field(default_factory=set)
    order: list[str] = field(default_factory=list)
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    output_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def probe(module: nn.Module, task: Any, examples: int = 2) -> Probe:
    """Run `task.loss` on its first `examples` training examples with every nn.Linear hooked; walk the graph to see
    which weights the loss reaches. The RNG and buffers (running statistics) are restored afterwards."""
    found = Probe()
    names = {id(m): n for n, m in module.named_modules() if isinstance(m, nn.Linear)}

    def hook(mod: nn.Module, inputs: tuple, output: Any) -> None:
        name = names[id(mod)]
        if name not in found.input_shapes:
            found.order.append(name)
            found.input_shapes[name] = tuple(inputs[0].shape)
            found.output_shapes[name] = tuple(output.shape)

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, nn.Linear)]
    rng = torch.get_rng_state()
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    try:
        batch = task.batch(torch.arange(min(examples, int(task.num_train))))
        with torch.enable_grad():
            loss = task.loss(module, batch)
        seen, stack = set(), [loss.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            variable = getattr(fn, "variable", None)
            if variable is not None:
                found.reached.add(id(variable))
            stack.extend(f for f, _ in fn.next_functions)
        del loss
    finally:
        for h in handles:
            h.remove()
        torch.set_rng_state(rng)
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(buffers[n])
    return found


def find_head(module: nn.Module, head: str | None, found: Probe | None) -> str:
    """The output layer's module name (see the module docstring); an InvalidInputError if it is not an nn.Linear."""
    modules = dict(module.named_modules())
    if head is None:
        if isinstance(modules.get("head"), nn.Linear):
            head = "head"
        elif found is not None and found.order:
            head = found.order[-1]
        else:
            linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
            if not linears:
                raise InvalidInputError("dfa trains nn.Linear layers: this model has none (no output layer either)")
            head = linears[-1]
    if head not in modules:
        raise InvalidInputError(f"dfa head {head!r} is not a module of the model")
    if not isinstance(modules[head], nn.Linear):
        raise InvalidInputError(f"dfa head {head!r} is a {type(modules[head]).__name__}: the output layer must be an nn.Linear")
    return head


def find_sites(module: nn.Module, head: str, layers: Sequence[str] | None, found: Probe | None) -> list[Site]:
    """The hidden DFA layers (in call order when probed), with their fused activations. Raises InvalidInputError for
    a named module that is missing, not an nn.Linear, the head, frozen or not reached, and when none is left."""
    modules = dict(module.named_modules())
    head_linear = modules[head]

    def usable(name: str, m: nn.Module) -> bool:
        return (isinstance(m, nn.Linear) and m is not head_linear and m.weight.requires_grad
                and (found is None or id(m.weight) in found.reached))

    if layers is not None:
        for name in layers:
            if name not in modules:
                raise InvalidInputError(f"dfa layer {name!r} is not a module of the model")
            m = modules[name]
            if not isinstance(m, nn.Linear):
                raise InvalidInputError(f"dfa layer {name!r} is a {type(m).__name__}: DFA trains nn.Linear layers only")
            if m is head_linear:
                raise InvalidInputError(f"dfa layer {name!r} is the output layer: it is trained as the head, not by feedback")
            if not m.weight.requires_grad:
                raise InvalidInputError(f"dfa layer {name!r} is frozen (its weight does not require grad)")
            if found is not None and id(m.weight) not in found.reached:
                raise InvalidInputError(f"dfa layer {name!r} is not reached by the task's loss: its output is unused")
        chosen = list(dict.fromkeys(layers))
    else:
        chosen = [n for n, m in modules.items() if usable(n, m)]
    if found is not None:
        rank = {n: i for i, n in enumerate(found.order)}
        chosen.sort(key=lambda n: rank.get(n, len(rank)))
    if not chosen:
        raise InvalidInputError(f"dfa found no eligible layer: no trainable nn.Linear besides the output layer {head!r} "
                                "is reached by the loss (DFA trains linear layers through fixed feedback matrices)")
    followers = _followers(module)
    sites = []
    for name in chosen:
        site = Site(name, modules[name])
        follow = followers.get(id(modules[name]))
        if follow is not None:
            parent, index = follow
            act = activation_of(parent[index])
            if act is not None:
                site.activation, site.activation_path, site.activation_module = act, (parent, index), parent[index]
        sites.append(site)
    return sites


def _followers(module: nn.Module) -> dict[int, tuple[nn.Sequential, int]]:
    """id(child) -> (its nn.Sequential parent, the index of the child right after it)."""
    out: dict[int, tuple[nn.Sequential, int]] = {}
    for m in module.modules():
        if isinstance(m, nn.Sequential):
            children = list(m)
            for i in range(len(children) - 1):
                out.setdefault(id(children[i]), (m, i + 1))
    return out


def matched_chain(sites: Sequence[Site], head: nn.Linear, depth: int | None) -> list[int]:
    """Indices into `sites` of the chain under the output layer (bottom first; see the module docstring)."""
    chain: list[int] = []
    upper = head
    for i in range(len(sites) - 1, -1, -1):
        if depth is not None and len(chain) >= depth:
            break
        if sites[i].linear.out_features != upper.in_features:
            break
        chain.append(i)
        upper = sites[i].linear
    return chain[::-1]
