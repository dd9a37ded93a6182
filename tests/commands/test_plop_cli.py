"""`rankwise place`: prints per-type NFN scores and a target list, on a tiny saved model and the real task data."""

import json

import pytest

from rankwise.cli import main
from rankwise.models import load_smollm2_tokenizer, tiny_llama

pytestmark = pytest.mark.method("plop")


def test_place_prints_scores_and_targets(tmp_path, capsys):
    folder = tmp_path / "tiny"
    tiny_llama(num_layers=2).save_pretrained(folder)
    load_smollm2_tokenizer().save_pretrained(folder)
    out_json = tmp_path / "plop.json"
    code = main(["--quiet", "place", "--model", str(folder), "--task", "wiki-topics", "--examples", "8",
                 "--seq-len", "16", "--batch-size", "4", "--json", str(out_json)])
    assert code == 0
    printed = capsys.readouterr().out
    saved = json.loads(out_json.read_text())
    assert len(saved["per_type"]) == 7 and len(saved["target_modules"]) == 3
    assert json.dumps(saved["target_modules"]) in printed and "q_proj" in printed
    assert set(saved["target_modules"]).isdisjoint(saved["inverse"]) or len(saved["per_type"]) < 6


def test_place_rejects_bad_input(tmp_path, capsys):
    folder = tmp_path / "tiny"
    tiny_llama(num_layers=1).save_pretrained(folder)
    load_smollm2_tokenizer().save_pretrained(folder)
    assert main(["--quiet", "place", "--model", str(folder), "--task", "wiki-lm", "-k", "9", "--examples", "2", "--seq-len", "8"]) == 2
    assert "k must be between 1" in capsys.readouterr().err
