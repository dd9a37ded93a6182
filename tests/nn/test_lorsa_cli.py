"""`rankwise lorsa top` on a saved Lorsa of a tiny Llama (the real command path: load, capture, rank, decode)."""

import pytest

from rankwise.cli import main
from rankwise.nn.lorsa import save_lorsa

pytestmark = pytest.mark.method("lorsa")


@pytest.fixture
def saved(tmp_path, tmp_cache):
    from rankwise.models import load_smollm2_tokenizer, tiny_llama
    from rankwise.repro.lorsa.capture import exact_lorsa

    model = tiny_llama(seed=0)
    model.save_pretrained(tmp_path / "model")
    load_smollm2_tokenizer().save_pretrained(tmp_path / "model")
    lorsa = exact_lorsa(model, 1)  # K = n_ov: every head is active, so every head has contexts
    save_lorsa(lorsa, tmp_path / "lorsa", source={"model": str(tmp_path / "model"), "layer": 1, "seq_len": 32})
    return tmp_path / "lorsa"


def test_lorsa_top_prints_the_contexts(saved, capsys):
    assert main(["--quiet", "lorsa", "top", str(saved), "--head", "5", "--n", "3", "--windows", "4"]) == 0
    out = capsys.readouterr().out
    assert "head 5 of 64" in out and "layer 1" in out
    assert sum(line.strip().startswith(("1.", "2.", "3.")) for line in out.splitlines()) == 3
    assert "[[" in out and "top source" in out


def test_lorsa_top_bad_head(saved, capsys):
    assert main(["--quiet", "lorsa", "top", str(saved), "--head", "64"]) == 2
    assert "--head must be in [0, 64)" in capsys.readouterr().err


def test_lorsa_top_not_a_lorsa_folder(tmp_path, capsys):
    assert main(["--quiet", "lorsa", "top", str(tmp_path), "--head", "0"]) == 2
    assert "error" in capsys.readouterr().err


# -- issue 32, item 14: a crafted `source` (its manifest rewritten to match) is named before the model loads ---------
@pytest.mark.parametrize("source, says", [
    ({"layer": "abc"}, "field 'layer' must be an integer"),
    ({"layer": 1.5}, "field 'layer' must be an integer"),  # int(1.5) ran layer 1 and printed "layer 1.5"
    ({"layer": 2}, r"attention layers are \[0, 2\)"),  # tiny_llama has 2 layers: an IndexError deep in the capture
    ({"layer": -1}, r"attention layers are \[0, 2\)"),
    ({"seq_len": "long"}, "field 'seq_len' must be an integer"),
    ({"model": 5}, "field 'model' must be a string"),
    ([1, 2], "field 'source' must be a JSON object"),
])
def test_a_crafted_source_is_refused_before_the_model_loads(saved, capsys, monkeypatch, source, says):
    import json
    import re

    import rankwise.models
    from rankwise.core.io import read_json, write_manifest

    meta = read_json(saved / "lorsa.json")
    meta["source"] = {**meta["source"], **source} if isinstance(source, dict) else source
    (saved / "lorsa.json").write_text(json.dumps(meta))
    write_manifest(saved, {k: v for k, v in read_json(saved / "rankwise-manifest.json").items() if k != "files"})
    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["--quiet", "lorsa", "top", str(saved), "--head", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankwise: error:") and "Traceback" not in err
    assert re.search(says, err), err


def test_lorsa_top_on_a_folder_of_another_kind_says_what_it_expected(tmp_path, capsys):
    from rankwise.cli import main
    from rankwise.models import tiny_llama

    tiny_llama(num_layers=1).save_pretrained(tmp_path / "model")
    assert main(["lorsa", "top", str(tmp_path / "model"), "--head", "0"]) == 2
    assert "not a fitted Lorsa folder" in capsys.readouterr().err
