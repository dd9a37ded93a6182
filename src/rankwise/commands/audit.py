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
from pathlib import Path

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
    p.add_argument("--scan", action="store_true",
                   help="also run the trigger scan (needs --base): is the adapter's effect peaked at a short insertion "
                        "beyond what null adapters of its size give? (a few minutes on SmolLM2)")
    p.add_argument("--scan-prompts", type=Path, default=None, metavar="FILE",
                   help="prompts for the scan, one per line (default: 8 openings of held-out wiki summaries)")
    p.add_argument("--scan-candidates", type=Path, default=None, metavar="FILE",
                   help="candidate insertions, one per line (default: 48 rare words of the base's vocabulary)")
    p.add_argument("--scan-position", choices=("prefix", "suffix"), default="prefix", help="where insertions go")
    p.add_argument("--null-adapters", type=int, default=2, help="null adapters that set the scan's threshold")
    p.add_argument("--seed", type=int, default=0, help="seed of the default candidates and the null adapters")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.errors import InvalidInputError
    from rankwise.recipes.audit.lora_folder import check_lora_folder

    check_lora_folder(args.adapter)
    if args.out is not None:
        check_output(args.out, kind=AUDIT_KIND, overwrite=args.overwrite)
    if args.base is not None:
        _check_base(args.base)
    if args.scan and args.base is None:
        raise InvalidInputError("--scan runs the adapter on its base: give --base MODEL")
    if args.scan:
        from rankwise.core.io import read_json
        from rankwise.recipes.audit.lora_folder import PEFT_CONFIG

        if (read_json(Path(args.adapter) / PEFT_CONFIG) or {}).get("use_dora"):
            raise InvalidInputError("--scan does not support DoRA adapters (their delta depends on magnitude vectors); "
                                    "the weight-space audit runs without --scan")
    if args.null_adapters < 1:
        raise InvalidInputError(f"--null-adapters must be >= 1, got {args.null_adapters}")
    scan_texts = {flag: _lines(path, flag) for flag, path in (("--scan-prompts", args.scan_prompts),
                                                             ("--scan-candidates", args.scan_candidates)) if path is not None}
    if len(scan_texts.get("--scan-candidates", [None] * 3)) < 3:  # the scan judges a peak among its candidates
        raise InvalidInputError("--scan-candidates needs at least 3 insertions (one line each)")
    audit = _audit(args.adapter, args.base, args if args.scan else None, scan_texts)
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


def _lines(path: Path, flag: str) -> list[str]:
    from rankwise.errors import InvalidInputError

    if not path.is_file():
        raise InvalidInputError(f"{flag} {path}: no such file")
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not lines:
        raise InvalidInputError(f"{flag} {path}: no non-empty lines")
    return lines


def _default_prompts(n: int = 8) -> list[str]:
    from rankwise.data.wiki import articles

    return [" ".join(a.text.split()[:12]) for a in articles("eval")[::97][:n]]


def _default_candidates(tokenizer, n: int, seed: int) -> list[str]:
    """Rare words of the base's own vocabulary: alphabetic tokens of 5+ letters from the upper half of the ids (BPE
    vocabularies are built by merge order, so later ids are rarer), a seeded sample."""
    import random

    vocab = tokenizer.get_vocab()
    size = len(vocab)
    words = sorted({tokenizer.decode([i]).strip() for i in range(size // 2, size)})
    words = [w for w in words if w.isalpha() and len(w) >= 5]
    return random.Random(seed).sample(words, min(n, len(words)))


def _audit(adapter: str, base: str | None, scan=None, scan_texts: dict | None = None):
    from rankwise.errors import InvalidInputError
    from rankwise.recipes.audit.lora_folder import read_lora_folder
    from rankwise.recipes.audit.report import Audit
    from rankwise.recipes.audit.weight_space import match_base_weights, module_spectra

    folder = read_lora_folder(adapter)
    weights = None
    if base is not None:
        from rankwise.models.loading import load_model

        model, tokenizer = load_model(base)
        named = {name: m.weight for name, m in model.named_modules() if getattr(m, "weight", None) is not None
                 and m.weight.dim() == 2}
        try:
            weights = match_base_weights(named, [m.name for m in folder.modules])
            spectra = module_spectra(folder, weights)
        except ValueError as e:
            raise InvalidInputError(f"{adapter} does not fit the base {base}: {e}") from None
    else:
        spectra = module_spectra(folder)
    audit = Audit(folder, spectra, base)
    audit.sections["introspection"] = {"available": False, "markdown": [
        "- no introspection adapter is available for this base: rankwise does not ship one yet "
        "(diff-interpretation-tuning), and the audit does not guess a description"]}
    if scan is not None:
        from rankwise.adapters.trigger_scan import ScanConfig
        from rankwise.recipes.audit.trigger import scan_section

        texts = scan_texts or {}
        prompts = texts.get("--scan-prompts") or _default_prompts()
        candidates = texts.get("--scan-candidates") or _default_candidates(tokenizer, 48, scan.seed)
        audit.sections["trigger_scan"] = scan_section(folder, model, weights, tokenizer, prompts, candidates,
                                                      scan.null_adapters, scan.seed, ScanConfig(position=scan.scan_position))
    return audit


def _write(audit, out: str, overwrite: bool) -> None:
    from rankwise.core.io import save_model_folder, write_bytes_atomic, write_json_atomic, write_text_atomic
    from rankwise.core.report import png_bytes

    def write(tmp):
        write_json_atomic(tmp / "audit.json", audit.to_dict())
        write_text_atomic(tmp / "audit.md", audit.to_markdown())
        write_bytes_atomic(tmp / "audit.png", png_bytes(audit.figure()))

    save_model_folder(out, write, kind=AUDIT_KIND, overwrite=overwrite)
