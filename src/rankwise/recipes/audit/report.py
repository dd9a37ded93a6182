"""The audit's findings as one JSON-ready dictionary, as Markdown, and as a figure.

Sections, each present only when its analysis ran: `weight_space` (always: per-module spectra, energy by layer and
by module type, outliers), `introspection` (a description of the adapter by an introspection adapter trained for
its base: none is available for most bases, and the section says so rather than guessing), `trigger_scan` and
`fairness` (filled by their analyses when the command is given what they need).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rankwise.recipes.audit.lora_folder import LoraFolder
from rankwise.recipes.audit.weight_space import OUTLIER_Z, ModuleSpectrum, energy_by, outliers

AUDIT_FORMAT = "rankwise-audit"
AUDIT_VERSION = 1


@dataclass
class Audit:
    folder: LoraFolder
    spectra: list[ModuleSpectrum]
    base: str | None = None
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)  # introspection, trigger_scan, fairness

    def summary(self) -> dict[str, Any]:
        total = sum(s.frobenius ** 2 for s in self.spectra) ** 0.5
        relative = [s.relative_to_base for s in self.spectra if s.relative_to_base is not None]
        return {
            "modules": len(self.spectra),
            "ranks": sorted({s.rank for s in self.spectra}),
            "parameters": sum(s.rank * (s.shape[0] + s.shape[1]) for s in self.spectra),
            "total_frobenius": total,
            "max_relative_to_base": max(relative) if relative else None,
            "mean_effective_rank": sum(s.effective_rank for s in self.spectra) / len(self.spectra),
            "outliers": [s.name for s in outliers(self.spectra)],
            "dora": any(s.dora for s in self.spectra),
            "saved_whole": sorted(self.folder.saved_whole),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": AUDIT_FORMAT, "version": AUDIT_VERSION,
            "adapter": str(self.folder.path), "base": self.base,
            "declared_base": self.folder.base_model,
            "peft_config": {k: self.folder.config.get(k) for k in ("r", "lora_alpha", "use_rslora", "use_dora",
                                                                  "target_modules", "rank_pattern", "alpha_pattern")},
            "summary": self.summary(),
            "weight_space": {
                "energy_by_layer": energy_by(self.spectra, "layer"),
                "energy_by_module_type": energy_by(self.spectra, "module_type"),
                "outlier_rule": f"|modified z of log ||delta||_F| > {OUTLIER_Z} among >= 5 modules of one type",
                "modules": [s.to_dict() for s in self.spectra],
            },
            **self.sections,
        }

    def to_markdown(self) -> str:
        s = self.summary()
        lines = [f"# Adapter audit: `{self.folder.path.name}`", "",
                 f"- adapter: `{self.folder.path}`; declared base: `{self.folder.base_model}`; audited against: "
                 f"`{self.base or 'no base (weight-space only)'}`",
                 f"- {s['modules']} adapted modules, rank(s) {s['ranks']}, {s['parameters']:,} adapter parameters; "
                 f"total ||delta||_F {s['total_frobenius']:.4g}; mean effective rank {s['mean_effective_rank']:.2f}"]
        if s["max_relative_to_base"] is not None:
            lines.append(f"- largest change relative to its base weight: {s['max_relative_to_base']:.3%}")
        if s["dora"]:
            lines.append("- DoRA adapter: the spectra are of the low-rank direction update B A; its magnitude vectors "
                         "rescale each output row on top")
        if s["saved_whole"]:
            lines.append(f"- also replaces whole tensors (modules_to_save): {', '.join(f'`{n}`' for n in s['saved_whole'])}")
        flagged = outliers(self.spectra)
        lines += ["", "## Weight space", "",
                  f"Outliers ({self.to_dict()['weight_space']['outlier_rule']}): "
                  + (", ".join(f"`{o.name}` (z {o.outlier_z:+.1f})" for o in flagged) if flagged else "none"), "",
                  "| module | shape | rank | ||delta||_F | rel. to base | sigma_1 | eff. rank | top-1 share | z |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m in self.spectra:
            rel = "" if m.relative_to_base is None else f"{m.relative_to_base:.3%}"
            z = "" if m.outlier_z is None else f"{m.outlier_z:+.1f}"
            lines.append(f"| `{m.name}` | {m.shape[0]}x{m.shape[1]} | {m.rank} | {m.frobenius:.4g} | {rel} | "
                         f"{m.spectral:.4g} | {m.effective_rank:.2f} | {m.top_energy_share:.2f} | {z} |")
        lines += ["", "Energy share by module type: " + ", ".join(
            f"`{k}` {v:.1%}" for k, v in energy_by(self.spectra, "module_type").items())]
        for name, section in self.sections.items():
            lines += ["", f"## {name.replace('_', ' ').capitalize()}", ""]
            lines += section.get("markdown", [f"`{section}`"]) if isinstance(section.get("markdown"), list) else [
                f"- {k}: {v}" for k, v in section.items()]
        lines += ["", "![spectra](audit.png)"]
        return "\n".join(lines) + "\n"

    def figure(self) -> Any:
        """Energy by layer and module type (heat map) and every module's normalised singular values."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        types = sorted({m.module_type for m in self.spectra})
        layers = sorted({m.layer for m in self.spectra if m.layer is not None})
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
        if layers:
            grid = [[0.0] * len(layers) for _ in types]
            for m in self.spectra:
                if m.layer is not None:
                    grid[types.index(m.module_type)][layers.index(m.layer)] = m.frobenius
            image = ax1.imshow(grid, aspect="auto", cmap="viridis")
            ax1.set_xticks(range(len(layers)), [str(x) for x in layers], fontsize=6)
            ax1.set_yticks(range(len(types)), [t.split(".")[-1] for t in types], fontsize=7)
            ax1.set_xlabel("layer")
            fig.colorbar(image, ax=ax1, label="||delta||_F")
            for m in outliers(self.spectra):
                if m.layer is not None:
                    ax1.plot(layers.index(m.layer), types.index(m.module_type), "rx", ms=10, mew=2)
        ax1.set_title("where the change sits (x: outlier)", fontsize=9)
        for m in self.spectra:
            top = m.singular_values[0] if m.singular_values and m.singular_values[0] > 0 else 1.0
            ax2.plot(range(1, len(m.singular_values) + 1), [v / top for v in m.singular_values], "-", alpha=0.35, lw=1)
        ax2.set_yscale("log")
        ax2.set_xlabel("singular value index")
        ax2.set_ylabel("sigma_i / sigma_1")
        ax2.set_title("every module's delta spectrum", fontsize=9)
        fig.tight_layout()
        return fig
