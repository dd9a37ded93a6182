"""DFA with feedback-weight matching as a training procedure: `loss.backward()` is the direct-feedback-alignment
step (`autograd`), the optimizer's step applies it.

    rankwise finetune --model minilm-l6 --task wiki-topics --method full --procedure dfa \\
        --procedure-option matching=none --procedure-option weight_decay=1e-3 --out runs/dfa

    procedure = build(module, task, seed=0, matching="fwm", weight_decay=1e-3)
    train(module, task, TrainConfig(...), procedure=procedure)

`build` swaps the model's linear layers in place (`sites`): each hidden nn.Linear becomes a `DFALinear` holding a
fixed feedback matrix F_l [out, n_L] ~ N(0, 1/n_L) (seeded), the output layer a `DFAOutputLinear`; every other
parameter is frozen (no error signal reaches it: norms, embeddings, convolutions stay as they are). Then, with
`matching` (the card's feedback-weight matching, on the chain under the output layer, `matching.py`):

- "fwm": F̄ from the pretrained weights (feedback matching) and the middle weights re-initialised to F̄_l F̄_{l-1}ᵀ
  (weight matching): the method;
- "feedback": F̄ only (the pretrained weights kept) — an ablation;
- "weights": the weights re-initialised to F̄_l F̄_{l-1}ᵀ, but DFA runs with the random F — the other ablation;
- "none": plain DFA with random F (the paper's DFA_fine, or DFA_scratch on a fresh model).

Matching happens in `build`, or after `head_steps` optimizer steps that train the output layer only (a new head
fitted on frozen features first: the card's reading for a new task). `weight_decay` is the card's λ, added to every
DFA update (ΔW = −η(δ xᵀ + λ W)) whatever the optimizer: with plain SGD it is exactly the card's rule.

`end_of_training` puts the original nn.Linear and activation modules back (their Parameters hold the trained
weights) and unfreezes what `build` froze: the saved model is a plain one. The feedback matrices are not part of
it (they are in checkpoints, for resume).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rankwise.core.options import config_or_options, option
from rankwise.core.training import Procedure
from rankwise.errors import InvalidInputError
from rankwise.recipes.dfa.alignment import cosine, gradient_alignment, weight_alignment
from rankwise.recipes.dfa.autograd import FROM_OUTPUT, broadcast_signal
from rankwise.recipes.dfa.layers import DFALinear, DFAOutputLinear, FeedbackHub
from rankwise.recipes.dfa.matching import feedback_matching, random_feedback, weight_matching
from rankwise.recipes.dfa.sites import Probe, Site, find_head, find_sites, matched_chain, probe

MATCHINGS = ("fwm", "feedback", "weights", "none")


@dataclass(frozen=True)
class DfaConfig:
    """Options of `--procedure dfa` (see the module docstring)."""

    matching: str = field(default="fwm", metadata=option(choices=MATCHINGS, help="feedback-weight matching, an ablation, or none"))
    weight_decay: float = 1e-3  # λ of the DFA update
    layers: str | tuple[str, ...] | None = None  # nn.Linear module names trained by DFA (default: all the loss reaches)
    head: str | None = None  # the output layer's module name (default: `head`, else the last linear called)
    match_depth: int | None = None  # DFA layers in the matched chain under the output layer (None: all that chain)
    head_steps: int = 0  # optimizer steps training the output layer only, before matching and DFA
    alignment_every: int = 0  # record WA and GA every N steps (0: never; costs a BP pass each time)

    def validate(self) -> None:
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InvalidInputError(f"dfa: weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if self.match_depth is not None and self.match_depth < 1:
            raise InvalidInputError(f"dfa: match_depth must be at least 1 (or None: the whole chain), got {self.match_depth}")
        for name in ("head_steps", "alignment_every"):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"dfa: {name} must be >= 0, got {getattr(self, name)}")
        layer_names(self.layers)
        if self.head is not None and not self.head:
            raise InvalidInputError("dfa: head must be a module name (or None)")

    def layer_list(self) -> list[str] | None:
        return layer_names(self.layers)


def layer_names(value: str | tuple[str, ...] | list[str] | None) -> list[str] | None:
    """"a,b" or ("a", "b") -> ["a", "b"]; None stays None; an empty list of names is refused."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidInputError(f"dfa: layers takes module names such as net.0,net.2, got {value!r}")
    return names


class DfaProcedure(Procedure):
    """Direct feedback alignment on `sites` under the output layer `head_name` (see the module docstring)."""

    name = "dfa"
    resumable = True  # the feedback matrices and whether matching ran are checkpointed (state_tensors)

    def __init__(self, module: nn.Module, sites: list[Site], head_name: str, config: DfaConfig, seed: int,
                 task: Any = None) -> None:
        self.module, self.config, self.seed, self.task = module, config, seed, task
        self.hub = FeedbackHub(config.weight_decay)
        modules = dict(module.named_modules())
        self.head_linear: nn.Linear = modules[head_name]
        self.head_name = head_name
        self.num_outputs = self.head_linear.out_features
        self.sites = sites
        self.chain = matched_chain(sites, self.head_linear, config.match_depth) if config.matching != "none" else []
        if config.matching != "none" and not self.chain:
            raise InvalidInputError(
                f"dfa matching={config.matching}: no DFA layer feeds the output layer {head_name!r} directly (out_features "
                f"{sites[-1].linear.out_features} of {sites[-1].name!r} != its in_features {self.head_linear.in_features}); "
                "pass matching=none, or name the layers")
        self.alignment_log: list[dict[str, Any]] = []
        self.matched = False
        self._wrap(seed)
        if config.head_steps == 0 and config.matching != "none":
            self.match()

    # --- the model's modules -------------------------------------------------------------------------------------
    def _wrap(self, seed: int) -> None:
        self.frozen = [p for p in self.module.parameters() if p.requires_grad]
        trained = {id(p) for s in self.sites for p in s.linear.parameters()} | {id(p) for p in self.head_linear.parameters()}
        for p in self.frozen:
            if id(p) not in trained:
                p.requires_grad_(False)
        self.frozen = [p for p in self.frozen if id(p) not in trained]
        self.dfa_layers: list[DFALinear] = []
        for i, site in enumerate(self.sites):
            generator = torch.Generator().manual_seed((seed % 2**31) * 1_000_003 + i)
            feedback = random_feedback(site.linear.out_features, self.num_outputs, generator, site.linear.weight.dtype)
            layer = DFALinear(site.linear, feedback, self.hub, site.activation, site.name)
            _set(self.module, site.name, layer)
            if site.activation_path is not None:
                parent, index = site.activation_path
                parent[index] = nn.Identity()  # fused into the DFA layer
            self.dfa_layers.append(layer)
        self.output = DFAOutputLinear(self.head_linear, self.hub, self.head_name)
        _set(self.module, self.head_name, self.output)
        self.wrapped = True

    def _unwrap(self) -> None:
        if not self.wrapped:
            return
        for site in self.sites:
            _set(self.module, site.name, site.linear)
            if site.activation_path is not None:
                parent, index = site.activation_path
                parent[index] = site.activation_module
        _set(self.module, self.head_name, self.head_linear)
        for p in self.frozen:
            p.requires_grad_(True)
        self.wrapped = False

    # --- feedback-weight matching --------------------------------------------------------------------------------
    def chain_weights(self) -> list[torch.Tensor]:
        return [self.sites[i].linear.weight for i in self.chain] + [self.head_linear.weight]

    @torch.no_grad()
    def match(self) -> None:
        """Feedback matching and/or weight matching on the chain, as `config.matching` says (once)."""
        weights = self.chain_weights()
        feedbacks = feedback_matching(weights)
        if self.config.matching in ("fwm", "weights"):
            for i, w in zip(self.chain[1:], weight_matching(weights, feedbacks)[1:-1]):
                self.sites[i].linear.weight.copy_(w)
        if self.config.matching in ("fwm", "feedback"):
            for i, f in zip(self.chain, feedbacks):
                self.dfa_layers[i].feedback.copy_(f)
        self.matched = True

    # --- the loop's hooks ----------------------------------------------------------------------------------------
    def before_micro_batch(self, step: int, micro: int) -> None:
        self.hub.reset()
        warm = step < self.config.head_steps
        if not warm and not self.matched and self.config.matching != "none":
            self.match()
        self.hub.hidden_trains = not warm

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Any) -> None:
        every = self.config.alignment_every
        if every and (step + 1) % every == 0 and step + 1 > self.config.head_steps:
            self.alignment_log.append({"step": step + 1, "weight": self.weight_alignment(),
                                       "gradient": self.gradient_alignment(task, batch)})

    def end_of_training(self, module: nn.Module) -> None:
        if self.wrapped:
            self.final_weight_alignment = self.weight_alignment()
        self._unwrap()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"feedback/{layer.site_name}": layer.feedback for layer in self.dfa_layers}
        out["matched"] = torch.tensor(int(self.matched))
        return out

    def load_state_tensors(self, tensors: Any) -> None:
        with torch.no_grad():
            for layer in self.dfa_layers:
                key = f"feedback/{layer.site_name}"
                if key in tensors:
                    layer.feedback.copy_(tensors[key])
        if "matched" in tensors:
            self.matched = bool(int(tensors["matched"]))

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, "matching": self.config.matching, "weight_decay": self.config.weight_decay,
                "head": self.head_name, "dfa_layers": [s.name for s in self.sites],
                "fused_activations": {s.name: s.activation for s in self.sites if s.activation != "identity"},
                "matched_chain": [self.sites[i].name for i in self.chain], "head_steps": self.config.head_steps}

    # --- diagnostics ---------------------------------------------------------------------------------------------
    def weight_alignment(self) -> dict[str, float]:
        """WA of each layer of the chain under the output layer (all layers that chain, matched or not) but its
        lowest one, keyed by layer name (the output layer's under the head's name)."""
        chain = matched_chain(self.sites, self.head_linear, None)
        if not chain:
            return {}
        weights = [self.sites[i].linear.weight for i in chain] + [self.head_linear.weight]
        values = weight_alignment(weights, [self.dfa_layers[i].feedback for i in chain])
        names = [self.sites[i].name for i in chain[1:]] + [self.head_name]
        return dict(zip(names, values))

    def gradients(self, task: Any, batch: Any, mode: str) -> dict[str, torch.Tensor]:
        """The weight gradients of the DFA layers and the output layer on `batch` under `mode` ("dfa" or "bp"),
        weight decay left out; the parameters' .grad, the RNG and the mode are left as they were."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        saved = [p.grad for p in params]
        rng = torch.get_rng_state()
        mode0, decay0, trains0 = self.hub.mode, self.hub.weight_decay, self.hub.hidden_trains
        try:
            for p in params:
                p.grad = None
            self.hub.mode, self.hub.weight_decay, self.hub.hidden_trains = mode, 0.0, True
            self.hub.reset()
            with torch.enable_grad():
                task.loss(self.module, batch).backward()
            layers = [(s.name, s.linear.weight) for s in self.sites] + [(self.head_name, self.head_linear.weight)]
            return {n: (w.grad.detach().clone() if w.grad is not None else torch.zeros_like(w)) for n, w in layers}
        finally:
            for p, g in zip(params, saved):
                p.grad = g
            self.hub.mode, self.hub.weight_decay, self.hub.hidden_trains = mode0, decay0, trains0
            self.hub.reset()
            torch.set_rng_state(rng)

    def gradient_alignment(self, task: Any, batch: Any) -> dict[str, float]:
        """GA per layer: cos(DFA update, BP gradient) on `batch` (the output layer's is 1 by construction)."""
        return gradient_alignment(self.gradients(task, batch, "dfa"), self.gradients(task, batch, "bp"))

    def analytic_memory(self, batch: Any) -> dict[str, int]:
        """Bytes one DFA step holds, counted from the layers' shapes on `batch` (one forward, no graph):

        - "activations": what the DFA backward keeps from the forward — each DFA layer's input x and the output
          layer's input, by storage (each storage once, at its full size: q, k and v reading one tensor count it
          once; a view such as a CLS token keeps its whole token tensor alive), plus the pre-activation a of a
          fused gelu/silu (relu/tanh/sigmoid derive g' from h, the next layer's input);
        - "error": the output error e [*, n_L] held while the hidden layers' updates are formed;
        - "feedback": the fixed feedback matrices F_l;
        - "weights": every parameter of the model (trained or frozen);
        - "gradients": the trained parameters' gradients (DFA layers and output layer);
        - "optimizer": AdamW's two moments of the trained parameters (the loop's default; SGD with momentum holds
          half of it, plain SGD none)."""
        held: dict[int, torch.Tensor] = {}  # by storage; the tensors kept alive so that no storage is reused
        extra: list[torch.Tensor] = []
        logits: list[torch.Tensor] = []

        def keep(t: torch.Tensor) -> None:
            held[t.untyped_storage().data_ptr()] = t

        def on_hidden(layer: DFALinear, inputs: tuple, output: torch.Tensor) -> None:
            keep(inputs[0])
            if layer.activation in FROM_OUTPUT:
                keep(output)
            elif layer.activation != "identity":
                extra.append(output)  # a: a tensor of h's size, saved beside h

        def on_head(layer: DFAOutputLinear, inputs: tuple, output: torch.Tensor) -> None:
            keep(inputs[0])
            logits.append(output)

        handles = [layer.register_forward_hook(on_hidden) for layer in self.dfa_layers]
        handles.append(self.output.register_forward_hook(on_head))
        try:
            with torch.no_grad():
                self.task_loss(batch)
        finally:
            for h in handles:
                h.remove()
        trained = [p for p in self.module.parameters() if p.requires_grad]
        size = lambda ps: sum(p.numel() * p.element_size() for p in ps)  # noqa: E731
        return {"activations": sum(t.untyped_storage().nbytes() for t in held.values()) + size(extra),
                "error": sum(t.numel() * t.element_size() for t in logits),
                "feedback": size([layer.feedback for layer in self.dfa_layers]),
                "weights": size(list(self.module.parameters())), "gradients": size(trained),
                "optimizer": 2 * size(trained)}

    def task_loss(self, batch: Any) -> torch.Tensor:
        if self.task is None:
            raise InvalidInputError("dfa: analytic_memory needs the task the procedure was built with")
        return self.task.loss(self.module, batch)


def build(module: nn.Module, task: Any, seed: int, config: DfaConfig | None = None, **options: Any) -> DfaProcedure:
    """Builder for `rankwise finetune --method full --procedure dfa` (options: DfaConfig's fields). Everything is
    checked before training: a named layer that is missing, not an nn.Linear, frozen or unused, a model with no
    eligible layer, an output layer that is not an nn.Linear, an error that cannot reach a layer's output."""
    config = config_or_options(DfaConfig, config, options, "dfa")
    found: Probe | None = probe(module, task) if task is not None and hasattr(task, "batch") else None
    head = find_head(module, config.head, found)
    sites = find_sites(module, head, config.layer_list(), found)
    if found is not None and head in found.output_shapes:
        out_lead = torch.Size(found.output_shapes[head][:-1])
        for site in sites:
            shape = found.output_shapes.get(site.name)
            if shape is not None:
                broadcast_signal(torch.zeros(*out_lead, 1), torch.Size(shape[:-1]))
    return DfaProcedure(module, sites, head, config, seed, task)


def _set(root: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule at dotted `name` by `module`."""
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


__all__ = ["DfaConfig", "DfaProcedure", "build", "MATCHINGS", "cosine"]
