"""`AdaptedModel`: a model with named adapters injected into its linear layers (the counterpart of `PeftModel`).

    model = add_adapter(base_model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))   # -> AdaptedModel
    model.count_parameters()          # ParameterCount(trainable=..., total=...)
    model.add_adapter("other", PicaConfig(r=16, target_modules=[...]))
    model.set_adapter("other")        # forward uses (and training updates) only "other"
    with model.adapters_disabled(): ...   # exactly the base model
    model.merge(); model.unmerge()    # exact and idempotent
    model.save("folder")              # a PEFT folder (+ rankwise state); load_adapter(base, "folder") restores it

Attribute access falls through to the wrapped model (`.config`, `.generate`, ...), and `forward` is the model's.
"""

from __future__ import annotations

import copy as _copy
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.adapters.base import AdaptedLinear, Adapter, AdapterSite, SharedParameters
from rankwise.adapters.config import AdapterConfig, find_targets, layer_index, module_type
from rankwise.adapters.peft_format import SavedAdapter, agrees_with_peft_files, peft_form, read_adapter_sources, save_adapter
from rankwise.adapters.types import adapter_type
from rankwise.core.calibration import SecondMoment
from rankwise.errors import CorruptFileError, InvalidInputError, UnknownNameError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ParameterCount:
    trainable: int
    total: int

    @property
    def fraction(self) -> float:
        return self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return f"trainable {self.trainable:,} of {self.total:,} parameters ({100 * self.fraction:.4f}%)"


class AdaptedModel(nn.Module):
    """Wraps `model` (modified in place: targeted nn.Linear modules become AdaptedLinear). Base weights are frozen."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if isinstance(model, AdaptedModel):
            raise InvalidInputError("the model is already an AdaptedModel: call .add_adapter on it instead of wrapping it again")
        self.model = model
        self.shared = SharedParameters()
        self.configs: dict[str, AdapterConfig] = {}
        self.active_adapters: tuple[str, ...] = ()
        for p in model.parameters():
            p.requires_grad_(False)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":
                raise
            return getattr(self.model, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    # ---- adapters -------------------------------------------------------------------------------------------
    def add_adapter(
        self,
        name: str,
        config: AdapterConfig,
        statistics: Mapping[str, SecondMoment] | None = None,
        initialize: bool = True,
        modules: list[str] | None = None,
    ) -> list[str]:
        """Inject adapter `name` into the modules `config` selects (or exactly `modules`); make it the active one.

        `statistics` maps module names to calibration second moments for methods that need them. `initialize=False`
        allocates parameters without computing their initial values (the loader fills them). Returns the names.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidInputError(f"adapter name must be an identifier (letters, digits, _), got {name!r}")
        if name in self.configs:
            raise InvalidInputError(f"an adapter named {name!r} already exists; delete_adapter({name!r}) first or pick another name")
        cls = adapter_type(config.method)
        config.validate()
        targets = modules if modules is not None else find_targets(self._unwrapped_view(), config)
        if cls.needs_statistics and initialize:
            missing = [t for t in targets if statistics is None or t not in statistics]
            if missing:
                raise InvalidInputError(f"{config.method} needs calibration statistics for every target; missing for {missing[:3]}")
        layers = dict(self.model.named_modules())
        # Build all adapters before touching the model, so a failure (bad rank, missing module) leaves it unchanged.
        built: list[tuple[str, Adapter]] = []
        try:
            for target in targets:
                layer = layers.get(target)
                if not isinstance(layer, (nn.Linear, AdaptedLinear)):
                    raise InvalidInputError(f"module {target!r} is not an nn.Linear in this model (found {type(layer).__name__})")
                base = layer.base_layer if isinstance(layer, AdaptedLinear) else layer
                site = AdapterSite(
                    module_name=target,
                    module_type=module_type(target, config.layers_pattern),
                    layer_index=layer_index(target, config.layers_pattern),
                    base=base,
                    adapter_name=name,
                    shared=self.shared,
                    statistics=statistics.get(target) if statistics else None,
                )
                built.append((target, cls(site, config, initialize)))
        except Exception:
            self.shared.drop(f"{name}/")
            raise
        for target, adapter in built:
            layer = self.model.get_submodule(target)
            if not isinstance(layer, AdaptedLinear):
                layer = AdaptedLinear(layer)
                parent, _, child = target.rpartition(".")
                setattr(self.model.get_submodule(parent) if parent else self.model, child, layer)
            layer.adapters[name] = adapter
        self.configs[name] = config
        self.set_adapter(name)
        return targets

    def _unwrapped_view(self) -> nn.Module:
        """The model with AdaptedLinear shown as their base nn.Linear, for target matching by the original names."""
        return _LinearView(self.model)

    def adapted_layers(self) -> Iterator[tuple[str, AdaptedLinear]]:
        for n, m in self.model.named_modules():
            if isinstance(m, AdaptedLinear):
                yield n, m

    def adapters_of(self, name: str) -> dict[str, Adapter]:
        """module name -> the `name` adapter on it."""
        self._check(name)
        return {n: layer.adapters[name] for n, layer in self.adapted_layers() if name in layer.adapters}

    def _check(self, name: str) -> None:
        if name not in self.configs:
            raise UnknownNameError(f"no adapter named {name!r}; this model has {sorted(self.configs)}")

    def set_adapter(self, names: str | list[str]) -> None:
        """Make `names` the active adapters: they act in the forward and are the only trainable parameters."""
        names = [names] if isinstance(names, str) else list(names)
        for n in names:
            self._check(n)
        self.active_adapters = tuple(names)
        for _, layer in self.adapted_layers():
            layer.active = self.active_adapters
            for n, adapter in layer.adapters.items():
                for p in adapter.parameters():
                    p.requires_grad_(n in names)
        for key, p in self.shared.params.items():
            p.requires_grad_(SharedParameters.unescape(key).split("/", 1)[0] in names)

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Inside the block the model computes exactly the base model (merged deltas are bypassed too)."""
        layers = [layer for _, layer in self.adapted_layers()]
        for layer in layers:
            layer.disabled = True
        try:
            yield
        finally:
            for layer in layers:
                layer.disabled = False

    def delete_adapter(self, name: str) -> None:
        """Remove adapter `name` everywhere (unmerging first if it was merged); layers left empty are unwrapped."""
        self._check(name)
        for module_name, layer in list(self.adapted_layers()):
            if name in layer.merged:
                keep = tuple(n for n in layer.merged if n != name)
                layer.unmerge()
                layer.merge(keep)
            if name in layer.adapters:
                del layer.adapters[name]
            if not layer.adapters:
                layer.unmerge()
                parent, _, child = module_name.rpartition(".")
                setattr(self.model.get_submodule(parent) if parent else self.model, child, layer.base_layer)
        self.shared.drop(f"{name}/")
        del self.configs[name]
        self.set_adapter([n for n in self.active_adapters if n != name])

    # ---- merging --------------------------------------------------------------------------------------------
    def merge(self, names: str | list[str] | None = None) -> None:
        """Add the deltas of `names` (default: the active adapters) into the base weights; exact to undo."""
        names = self._names(names)
        for _, layer in self.adapted_layers():
            layer.merge(names)

    def unmerge(self) -> None:
        for _, layer in self.adapted_layers():
            layer.unmerge()

    @torch.no_grad()
    def merge_and_unload(self, names: str | list[str] | None = None) -> nn.Module:
        """Return the wrapped model with the deltas of `names` folded into plain nn.Linear layers (no adapters left)."""
        names = self._names(names)
        for module_name, layer in list(self.adapted_layers()):
            layer.unmerge()
            base = layer.base_layer
            for n in names:
                if n in layer.adapters:
                    base.weight.add_(layer.adapters[n].delta_weight().to(base.weight.dtype))
            parent, _, child = module_name.rpartition(".")
            setattr(self.model.get_submodule(parent) if parent else self.model, child, base)
        self.configs.clear()
        self.shared = SharedParameters()
        return self.model

    def _names(self, names: str | list[str] | None) -> tuple[str, ...]:
        if names is None:
            return self.active_adapters
        names = [names] if isinstance(names, str) else list(names)
        for n in names:
            self._check(n)
        return tuple(names)

    # ---- counting and saving --------------------------------------------------------------------------------
    def count_parameters(self) -> ParameterCount:
        """Unique parameters (shared ones once) of the whole wrapped model: trainable and total."""
        seen: dict[int, nn.Parameter] = {id(p): p for p in self.parameters()}
        return ParameterCount(sum(p.numel() for p in seen.values() if p.requires_grad), sum(p.numel() for p in seen.values()))

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """All tensors of adapter `name`: `<module>.<tensor>` per layer (parameters and buffers) and `shared/<key>`."""
        state: dict[str, torch.Tensor] = {}
        for module_name, adapter in self.adapters_of(name).items():
            for k, t in adapter.state_dict().items():
                state[f"{module_name}.{k}"] = t
        for key, p in self.shared.params.items():
            full = SharedParameters.unescape(key)
            if full.startswith(f"{name}/"):
                state[f"shared/{full.split('/', 1)[1]}"] = p.detach()
        return state

    def save(self, folder: str | Path, adapter_name: str = "default", **kwargs: Any) -> Path:
        """Write adapter `adapter_name` as a PEFT folder (+ rankwise state); see `rankwise.adapters.peft_format`."""
        return save_adapter(self, folder, adapter_name, **kwargs)


class _LinearView(nn.Module):
    """Presents a model's modules with AdaptedLinear replaced by their base layer (for `find_targets`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_wrapped", model)

    def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Module]]:
        for n, m in self._wrapped.named_modules(*args, **kwargs):
            if isinstance(m, AdaptedLinear):
                yield n, m.base_layer
            elif not n.endswith(".base_layer") and ".adapters." not in n and not n.endswith(".adapters"):
                yield n, m


def add_adapter(
    model: nn.Module,
    config: AdapterConfig,
    adapter_name: str = "default",
    statistics: Mapping[str, SecondMoment] | None = None,
) -> AdaptedModel:
    """Wrap `model` (unless already wrapped), inject adapter `adapter_name` per `config` and return the wrapper."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    adapted = model if isinstance(model, AdaptedModel) else AdaptedModel(model)
    try:
        adapted.add_adapter(adapter_name, config, statistics)
    except Exception:
        if adapted is not model:  # leave the caller's model as it was, trainable flags included
            for p, flag in flags:
                p.requires_grad_(flag)
        raise
    return adapted


def load_adapter(model: nn.Module, folder: str | Path, adapter_name: str = "default") -> AdaptedModel:
    """Load a saved adapter onto `model` (a base model or an AdaptedModel); returns the AdaptedModel.

    Reads our files when the folder's manifest vouches for them (exact round trip, any registered method), else the
    PEFT files, which are the source of truth: our files are then used only if they deploy to exactly those PEFT
    files, and otherwise the PEFT LoRA is loaded with a warning — so rankwise computes what `peft` computes. A
    plain PEFT folder written by peft loads too. Modules saved whole (`modules_to_save`, e.g. a classification
    head) are restored into `model`'s modules of those names. Raises CorruptFileError for a damaged folder and
    InvalidInputError, naming the module, when the adapter was saved for a model with different modules or shapes.
    """
    ours, peft_side, verified = read_adapter_sources(folder)
    adapted = model if isinstance(model, AdaptedModel) else AdaptedModel(model)
    chosen = ours if ours is not None and (verified or peft_side is None) else peft_side
    if chosen is ours and not verified and ours is not None:
        warnings.warn(f"{folder} has no valid manifest and no PEFT files to check against: loading its rankwise files as they are",
                      stacklevel=2)
    if ours is not None and chosen is peft_side:
        # Unverified: keep our (richer) reading only where it deploys to exactly what the PEFT files hold.
        _put(adapted, adapter_name, ours)
        if agrees_with_peft_files(peft_form(adapted.adapters_of(adapter_name), None, "", ours_to_save(ours), ours.extra), folder):
            return adapted
        adapted.delete_adapter(adapter_name)
        warnings.warn(
            f"{folder}: rankwise_adapter.* disagree with the PEFT files (edited after saving?); loading the PEFT files, "
            "which are what peft loads", stacklevel=2)
    _put(adapted, adapter_name, chosen)
    return adapted


def ours_to_save(saved: SavedAdapter) -> list[str]:
    """The module names of `saved.extra` (`head.weight` -> `head`), as PEFT's modules_to_save lists them."""
    return sorted({k.rsplit(".", 1)[0] for k in saved.extra})


def _put(adapted: AdaptedModel, adapter_name: str, saved: SavedAdapter) -> None:
    targets = dict(adapted.model.state_dict(keep_vars=True))
    missing = sorted(k for k in saved.extra if k not in targets)
    if missing:
        raise InvalidInputError(f"the adapter was saved with modules to save {missing[:3]}, which this model lacks "
                                "(for a classifier, load it onto SequenceClassifier(base, num_labels))")
    for key, value in saved.extra.items():
        if targets[key].shape != value.shape:
            raise InvalidInputError(f"the adapter was saved for a different model: {key} has shape {tuple(value.shape)}, "
                                    f"here {tuple(targets[key].shape)}")
    _check_modules(adapted, saved.modules, saved.state)
    adapted.add_adapter(adapter_name, saved.config, initialize=False, modules=saved.modules)
    _fill(adapted, adapter_name, saved.state)
    with torch.no_grad():
        for key, value in saved.extra.items():
            targets[key].copy_(value.to(targets[key].dtype))


def _check_modules(adapted: AdaptedModel, modules: list[str], state: dict[str, torch.Tensor]) -> None:
    """Every saved module must be a linear layer here (shapes are checked tensor by tensor in `_fill`)."""
    if not modules:
        raise CorruptFileError("the saved adapter lists no modules")
    layers = dict(adapted._unwrapped_view().named_modules())
    for name in modules:
        if not isinstance(layers.get(name), nn.Linear):
            raise InvalidInputError(f"the adapter was saved for a different model: it adapts {name!r}, which is not a linear layer of this model")


def _fill(adapted: AdaptedModel, adapter_name: str, state: dict[str, torch.Tensor]) -> None:
    for module, adapter in adapted.adapters_of(adapter_name).items():
        adapter.prepare_load({k[len(module) + 1 :]: v for k, v in state.items() if k.startswith(module + ".")})
    expected = adapted.adapter_state(adapter_name)
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        adapted.delete_adapter(adapter_name)
        raise CorruptFileError(f"saved adapter tensors do not match the adapter: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, target in expected.items():
        value = state[key]
        if value.shape != target.shape:
            adapted.delete_adapter(adapter_name)
            module = key.rsplit(".", 1)[0] if not key.startswith("shared/") else key
            raise InvalidInputError(
                f"the adapter was saved for a different model: {key} has shape {tuple(value.shape)}, "
                f"but {module} here needs {tuple(target.shape)}"
            )
    with torch.no_grad():
        for key, target in expected.items():
            target.copy_(state[key].to(target.dtype))


@torch.no_grad()
def base_model_copy(adapted: nn.Module) -> nn.Module:
    """A copy of the model an AdaptedModel wraps, with every adapted linear replaced by its base layer (as
    trained, e.g. by LMAO's zeroth-order steps, or quantized, e.g. by CoA-LoRA)
    and no adapter: what `save_pretrained` writes as the new base model."""
    inner = _copy.deepcopy(getattr(adapted, "model", adapted))
    for name, m in list(inner.named_modules()):
        if isinstance(m, AdaptedLinear):
            if m.merged:
                raise InvalidInputError(f"{name} has merged adapters: unmerge before exporting the base model")
            parent, _, child = name.rpartition(".")
            setattr(inner.get_submodule(parent) if parent else inner, child, m.base_layer)
    return inner
