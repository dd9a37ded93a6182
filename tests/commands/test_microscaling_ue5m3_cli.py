"""`rankwise quantize`: writes a packed folder, reloads it and reports quality and bytes per weight."""

import re

import pytest

from rankwise.cli import main
from rankwise.models import load_model, load_smollm2_tokenizer, tiny_llama

pytestmark = pytest.mark.method("microscaling-ue5m3")


def test_quantize_command_on_a_saved_tiny_llama(tmp_path, capsys):
    src = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(src)
    load_smollm2_tokenizer().save_pretrained(src)
    out = tmp_path / "q"
    code = main(["--quiet", "quantize", "--model", str(src), "--scale", "ue5m3", "--block", "16", "--out", str(out),
                 "--max-windows", "1"])
    assert code == 0
    text = capsys.readouterr().out
    measured = float(re.search(r"([0-9.]+) bytes per weight measured", text).group(1))
    assert 0.5625 <= measured < 0.57 and "perplexity" in text  # 4 bits + 8 bits / 16 + one fp32 per tensor
    model, _ = load_model(out)
    assert model.config.rankwise_format == "microscaling"


def test_quantize_command_rejects_a_bad_recipe(tmp_path, capsys):
    assert main(["quantize", "--model", "smollm2-135m", "--block", "7", "--out", str(tmp_path / "q")]) == 2
    assert "block size" in capsys.readouterr().err


@pytest.mark.real_model
def test_quantize_minilm_reports_embedding_fidelity(tmp_path, capsys):
    assert main(["--quiet", "quantize", "--model", "minilm-l6", "--scale", "ue4m3", "--global-scale", "--block", "16",
                 "--out", str(tmp_path / "q"), "--sentences", "8"]) == 0
    assert "cosine" in capsys.readouterr().out
