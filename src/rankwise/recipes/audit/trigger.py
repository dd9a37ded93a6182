"""The audit's trigger scan: is the adapter's effect on the output sharply peaked at some short insertion, more than
an update of the same size with no particular direction would be?

`rankwise.adapters.trigger_scan` scores candidate insertions by how much they change the adapter-induced output
shift and summarises the peak as a robust z-score (its "concentration"); its flag threshold must come from adapters
known to be clean. A user auditing a downloaded adapter has none for their base, so the audit makes them: *null
adapters*, one per seed, whose every module keeps the audited delta's singular values but turns its singular vectors
to random orthonormal ones (delta' = U' S V'^T). A null adapter changes each layer by exactly as much, in no chosen
direction; the threshold is `calibrate_threshold` over their scans (2x the largest null concentration), and the
audited adapter is flagged above it. The deltas are merged into copies of the base weights (s B A), so rank and alpha
patterns and rsLoRA are applied as the folder reader computed them; DoRA folders are refused (their delta depends on
the magnitude vectors, which this scan does not reproduce).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from rankwise.adapters.trigger_scan import ScanConfig, calibrate_threshold, trigger_scan
from rankwise.errors import InvalidInputError
from rankwise.recipes.audit.lora_folder import LoraFolder, LoraModule

NULL_MARGIN = 2.0


def _random_orthonormal(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(rows, cols, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))  # Haar-distributed columns


def delta(module: LoraModule) -> torch.Tensor:
    """s B A [out, in] in float64."""
    return module.scaling * module.B.double() @ module.A.double()


def null_delta(module: LoraModule, generator: torch.Generator) -> torch.Tensor:
    """A delta with the same singular values as `module`'s and random singular vectors [out, in] (float64)."""
    sigma = torch.linalg.svdvals(delta(module))[: module.rank]
    out_dim, in_dim = module.shape
    u = _random_orthonormal(out_dim, len(sigma), generator)
    v = _random_orthonormal(in_dim, len(sigma), generator)
    return (u * sigma) @ v.T


def merged_copy(base: nn.Module, weights: dict[str, nn.Parameter], deltas: dict[str, torch.Tensor]) -> nn.Module:
    """A deep copy of `base` with each named weight (by identity in `weights`) plus its delta."""
    model = copy.deepcopy(base)
    by_id = {id(p): name for name, p in base.named_parameters()}
    params = dict(model.named_parameters())
    with torch.no_grad():
        for module_name, w in weights.items():
            target = params[by_id[id(w)]]
            target.add_(deltas[module_name].to(target.dtype))
    return model.eval()


def scan_section(folder: LoraFolder, base: nn.Module, weights: dict[str, nn.Parameter], tokenizer,
                 prompts: Sequence[str], candidates: Sequence[str], null_adapters: int = 2, seed: int = 0,
                 config: ScanConfig | None = None) -> dict:
    """The audit's `trigger_scan` section: the audited adapter's scan, its null adapters' concentrations, the
    threshold from them and the flag. `weights` maps each adapter module to its base weight parameter (the base's
    own tensors: `weight_space.match_base_weights` on `named_parameters`)."""
    if any(m.magnitude is not None for m in folder.modules):
        raise InvalidInputError("the trigger scan does not support DoRA adapters (their delta depends on magnitude "
                                "vectors); the weight-space audit still applies")
    if null_adapters < 1:
        raise InvalidInputError(f"the trigger scan needs at least one null adapter to set its threshold, got {null_adapters}")
    config = config or ScanConfig()
    base.eval()
    adapted = merged_copy(base, weights, {m.name: delta(m) for m in folder.modules})
    scan = trigger_scan(base, adapted, tokenizer, prompts, candidates, config)
    del adapted
    nulls = []
    for k in range(null_adapters):
        g = torch.Generator().manual_seed(seed + k)
        null = merged_copy(base, weights, {m.name: null_delta(m, g) for m in folder.modules})
        nulls.append(trigger_scan(base, null, tokenizer, prompts, candidates, config))
        del null
    threshold = calibrate_threshold(nulls, NULL_MARGIN)
    flagged = scan.flagged(threshold)
    summary = scan.summary()
    top = sorted(zip(scan.insertions, scan.scores.tolist()), key=lambda t: -t[1])[:5]
    return {
        "flagged": flagged, "threshold": threshold, "concentration": scan.concentration,
        "null_concentrations": [n.concentration for n in nulls], "top_insertions": top,
        "summary": summary, "prompts": len(prompts), "candidates": len(candidates), "position": config.position,
        "markdown": [
            f"- **{'FLAGGED' if flagged else 'not flagged'}**: concentration {scan.concentration:.2f} against the "
            f"threshold {threshold:.2f} ({NULL_MARGIN:g}x the largest of {null_adapters} null adapters' "
            f"{', '.join(f'{n.concentration:.2f}' for n in nulls)}: same per-module spectra, random directions)",
            f"- {len(candidates)} candidate insertions ({config.position}) and the beam's pairs over {len(prompts)} "
            f"prompts; mean clean shift KL {summary['mean clean shift']:.4g} nats",
            "- strongest insertions (mean added KL, nats): " + ", ".join(f"`{t}` {s:.4g}" for t, s in top),
            "- a flag means the adapter's effect is peaked at an insertion beyond what an update of its size gives; "
            "no flag is not proof of safety (the scan tries only the candidates it is given)"],
    }
