"""`rankwise audit ADAPTER_DIR [--base MODEL]`: what a LoRA adapter changes, and whether anything in it stands out.

Reads any PEFT LoRA folder (written by peft, by rankwise, or downloaded) without unpickling anything, and reports
each adapted module's delta spectrum and energy, where the change sits by layer and module type, and the modules
whose change is out of line with their siblings (`rankwise.recipes.audit`). With `--base` the change is measured
against the weights it changes, and the adapter must fit that base. `--json` prints one JSON object; `--out DIR`
writes audit.json, audit.md and audit.png there (a new folder, or an earlier audit's).
"""

from __future__ import annotations

import argparse
import json
import sys

from rankwise.commands.common import check_output

AUDIT_KIND = "audit"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="what a LoRA adapter changes: spectra, energy, outlier modules",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("adapter", metavar="ADAPTER_DIR", help="a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors)")
    p.add_argument("--base", default=None, metavar="MODEL",
                   help="the base model (embedded name or folder): measure the change against its weights (default: weight space only)")
    p.add_argument("--json", action="store_true", help="print the audit as one JSON object")
    p.add_argument("--out", default=None, metavar="DIR", help="write audit.json, audit.md and audit.png there (default: print only)")
    p.add_argument("--overwrite", action="store_true", help="replace an --out folder that holds something else")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.recipes.audit.lora_folder import check_lora_folder

    check_lora_folder(args.adapter)
    if args.out is not None:
        check_output(args.out, kind=AUDIT_KIND, overwrite=args.overwrite)
    if args.base is not None:
        _check_base(args.base)
    audit = _audit(args.adapter, args.base)
    if args.out is not None:
        _write(audit, args.out, args.overwrite)
    if args.json:
        json.dump(audit.to_dict(), sys.stdout, indent=2, default=str)
        print()
    else:
        print(audit.to_markdown().replace("\n![spectra](audit.png)\n", "\n"), end="")
        if args.out is not None:
            print(f"\nwritten: {args.out}/audit.md, audit.json, audit.png")
    return 0


def _check_base(base: str) -> None:
    """Refuse a base that is neither an embedded model nor a model folder, before reading anything heavy."""
    from rankwise.models.embedded import EMBEDDED_MODELS
    from rankwise.models.folders import identify

    if base not in EMBEDDED_MODELS:
        identify(base)  # raises a RankwiseError naming what the path is (or is not)


def _audit(adapter: str, base: str | None):
    from rankwise.errors import InvalidInputError
    from rankwise.recipes.audit.lora_folder import read_lora_folder
    from rankwise.recipes.audit.report import Audit
    from rankwise.recipes.audit.weight_space import match_base_weights, module_spectra

    folder = read_lora_folder(adapter)
    weights = None
    if base is not None:
        from rankwise.models.loading import load_model

        model, _ = load_model(base)
        named = {name: m.weight for name, m in model.named_modules() if getattr(m, "weight", None) is not None
                 and m.weight.dim() == 2}
        try:
            weights = match_base_weights(named, [m.name for m in folder.modules])
            spectra = module_spectra(folder, weights)
        except ValueError as e:
            raise InvalidInputError(f"{adapter} does not fit the base {base}: {e}") from None
    else:
        spectra = module_spectra(folder)
    return Audit(folder, spectra, base)


def _write(audit, out: str, overwrite: bool) -> None:
    from rankwise.core.io import save_model_folder, write_bytes_atomic, write_json_atomic, write_text_atomic
    from rankwise.core.report import png_bytes

    def write(tmp):
        write_json_atomic(tmp / "audit.json", audit.to_dict())
        write_text_atomic(tmp / "audit.md", audit.to_markdown())
        write_bytes_atomic(tmp / "audit.png", png_bytes(audit.figure()))

    save_model_folder(out, write, kind=AUDIT_KIND, overwrite=overwrite)
