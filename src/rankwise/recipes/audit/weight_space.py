"""What an adapter changes in weight space: per-module spectra and energy, where the change sits (by layer and by
module type), and the modules whose change is out of line with their siblings.

For each adapted module the delta is s B A (`lora_folder.LoraModule`); its singular values come from the factors
(`core.rank_measures.factored_singular_values`), never from the dense product. With the base model's weights the
change is also measured relative to the weight it changes (||s B A||_F / ||W||_F), which is what says whether an
adapter nudges or rewrites a layer.

Outliers (the card's "weight-space anomalies"): among modules of one type (q_proj of every layer, ...), the
modified z-score of log ||delta||_F (Iglewicz & Hoaglin: 0.6745 (x - median) / MAD) above OUTLIER_Z flags a module.
A benign adapter spreads its change smoothly over layers; a planted behaviour often concentrates in a few modules.
The flag says "look here", not "malicious": adapters trained on few layers are uneven by design.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch

from rankwise.core.layer_names import layer_index, module_type
from rankwise.core.rank_measures import effective_rank, factored_singular_values, stable_rank, top_energy_share
from rankwise.recipes.audit.lora_folder import LoraFolder

OUTLIER_Z = 3.5  # Iglewicz & Hoaglin's recommended cut for the modified z-score
MIN_GROUP = 5  # fewer siblings than this: no outlier test (a median of 3 says little)
# The MAD of log-norms is floored here: siblings of one shape initialised alike have nearly equal norms (MAD ~ 0.01),
# and a z-score over that spread flags ordinary 5% differences. With the floor, a flag also needs the module's
# norm to be at least exp(OUTLIER_Z * MIN_LOG_MAD / 0.6745) ~ 1.68x (or 1/1.68x) its siblings' median.
MIN_LOG_MAD = 0.1


@dataclass
class ModuleSpectrum:
    """One module's delta: shape [out, in], rank, the singular values (descending) and the measures from them."""

    name: str
    module_type: str
    layer: int | None
    shape: tuple[int, int]
    rank: int
    scaling: float
    singular_values: list[float]
    frobenius: float
    spectral: float
    effective_rank: float
    stable_rank: float
    top_energy_share: float
    relative_to_base: float | None = None
    outlier_z: float | None = None
    dora: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def module_spectra(folder: LoraFolder, base_weights: Mapping[str, torch.Tensor] | None = None) -> list[ModuleSpectrum]:
    """The spectrum of every module's delta; `base_weights` maps module names to their base weight [out, in]."""
    spectra = []
    ordered = sorted(folder.modules, key=lambda m: (layer_index(m.name) is None, layer_index(m.name) or 0, m.name))
    for m in ordered:
        sigma = factored_singular_values(m.B * m.scaling, m.A)
        frob = float(sigma.square().sum().sqrt())
        relative = None
        if base_weights is not None and m.name in base_weights:
            w = base_weights[m.name].detach().to(torch.float64)
            if tuple(w.shape) != m.shape:
                raise ValueError(f"{m.name}: base weight {tuple(w.shape)} but the adapter's delta is {m.shape}")
            norm = float(torch.linalg.matrix_norm(w))
            relative = frob / norm if norm > 0 else math.inf
        spectra.append(ModuleSpectrum(
            name=m.name, module_type=module_type(m.name), layer=layer_index(m.name), shape=m.shape, rank=m.rank,
            scaling=m.scaling, singular_values=[float(s) for s in sigma], frobenius=frob,
            spectral=float(sigma.max()) if sigma.numel() else 0.0, effective_rank=effective_rank(sigma),
            stable_rank=stable_rank(sigma), top_energy_share=top_energy_share(sigma), relative_to_base=relative,
            dora=m.magnitude is not None))
    _mark_outliers(spectra)
    return spectra


def modified_z_scores(values: list[float], min_mad: float = 0.0) -> list[float]:
    """0.6745 (x - median) / max(MAD, min_mad); all zeros when that is 0 (identical values: nothing stands out)."""
    t = torch.tensor(values, dtype=torch.float64)
    median = t.median()
    mad = max(float((t - median).abs().median()), min_mad)
    if mad <= 0:
        return [0.0] * len(values)
    return [float(z) for z in 0.6745 * (t - median) / mad]


def _mark_outliers(spectra: list[ModuleSpectrum]) -> None:
    groups: dict[str, list[ModuleSpectrum]] = defaultdict(list)
    for s in spectra:
        groups[s.module_type].append(s)
    for members in groups.values():
        if len(members) < MIN_GROUP:
            continue
        logs = [math.log(max(s.frobenius, 1e-300)) for s in members]
        for s, z in zip(members, modified_z_scores(logs, MIN_LOG_MAD)):
            s.outlier_z = z


def energy_by(spectra: list[ModuleSpectrum], key: str) -> dict[str, float]:
    """Each group's share of the adapter's total squared Frobenius energy (key "layer" or "module_type")."""
    total = sum(s.frobenius ** 2 for s in spectra)
    shares: dict[str, float] = defaultdict(float)
    for s in spectra:
        group = getattr(s, key)
        shares["none" if group is None else str(group)] += (s.frobenius ** 2 / total) if total > 0 else 0.0
    return dict(sorted(shares.items(), key=lambda kv: (len(kv[0]), kv[0])))


def outliers(spectra: list[ModuleSpectrum], z: float = OUTLIER_Z) -> list[ModuleSpectrum]:
    return [s for s in spectra if s.outlier_z is not None and abs(s.outlier_z) > z]


def match_base_weights(named_weights: Mapping[str, torch.Tensor], modules: list[str]) -> dict[str, torch.Tensor]:
    """Each adapter module's base weight, by name: equal, or equal after dropping leading wrapper components on
    either side (PEFT names modules relative to the model it wrapped: `model.layers.0...` for a causal LM, one more
    `model.` inside a classifier wrapper). Raises ValueError naming the modules the base does not have."""
    found, missing = {}, []
    for name in modules:
        if name in named_weights:
            found[name] = named_weights[name]
            continue
        hits = [k for k in named_weights if k.endswith("." + name) or name.endswith("." + k)]
        if len(hits) == 1:
            found[name] = named_weights[hits[0]]
        else:
            missing.append(name)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ValueError(f"the base has no unique module for {shown}: is this adapter made for this base?")
    return found
