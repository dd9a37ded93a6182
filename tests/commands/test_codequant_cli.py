"""`rankwise quantize --format codequant`: writes the codequant folder, reloads it through load_model, `info` names
it; flags of the other format, encoders and bad groups are refused before any work."""

import re

import pytest

from rankwise.cli import main
from rankwise.compress.codequant import ClusteredLinear
from rankwise.models import load_model, load_smollm2_tokenizer, tiny_llama

pytestmark = pytest.mark.method("codequant")
FAST = ["--calibration-windows", "2", "--seq-len", "32", "--aos-steps", "2", "--accf-steps", "1", "--max-windows", "1"]


@pytest.fixture
def tiny_folder(tmp_path):
    src = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(src)
    load_smollm2_tokenizer().save_pretrained(src)
    return src


def test_codequant_round_trips_through_load_model_and_info(tiny_folder, tmp_path, capsys):
    out = tmp_path / "cq"
    assert main(["--quiet", "quantize", "--model", str(tiny_folder), "--format", "codequant", "--out", str(out), *FAST]) == 0
    text = capsys.readouterr().out
    assert "perplexity" in text
    measured = float(re.search(r"([0-9.]+) bytes per weight", text).group(1))
    assert 0.5 < measured < 4.0  # 4-bit codes + 16 fp32 centroids per row of 64 inputs: 0.5 + 1.0
    model, _ = load_model(out)
    assert sum(isinstance(m, ClusteredLinear) for m in model.modules()) == 10  # q, k, v, gate, up x 2 layers
    assert main(["info", str(out)]) == 0
    assert "CodeQuant" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--format", "codequant", "--block", "16"], "microscaling options"),
    (["--format", "fp4", "--aos-steps", "3"], "codequant only"),
])
def test_flags_of_the_other_format_are_refused(tiny_folder, tmp_path, capsys, argv, message):
    assert main(["quantize", "--model", str(tiny_folder), "--out", str(tmp_path / "q"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_an_encoder_is_refused_before_loading(tmp_path, capsys):
    assert main(["quantize", "--model", "minilm-l6", "--format", "codequant", "--out", str(tmp_path / "q")]) == 2
    assert "causal language model" in capsys.readouterr().err


def test_a_group_that_does_not_divide_is_refused(tiny_folder, tmp_path, capsys):
    assert main(["quantize", "--model", str(tiny_folder), "--format", "codequant", "--group", "7",
                 "--out", str(tmp_path / "q"), *FAST]) == 2
    assert "divisor" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
