"""No code from a model folder ever runs: a folder whose config (or tokenizer config) has an `auto_map` is refused
before transformers sees it, naming the file; a folder with only pickled weights is refused in words (a pickle can
run code), not with a traceback that suggests weights_only=False."""

import json

import pytest

from rankwise.cli import main
from rankwise.errors import InvalidInputError
from rankwise.models import folders, tiny_llama


@pytest.fixture
def plain_folder(tmp_path):
    from rankwise.models import load_smollm2_tokenizer

    model = tiny_llama(seed=0)
    model.save_pretrained(tmp_path / "m")
    load_smollm2_tokenizer().save_pretrained(tmp_path / "m")
    return tmp_path / "m"


@pytest.mark.parametrize("config_file", ["config.json", "tokenizer_config.json"])
def test_an_auto_map_folder_is_refused_naming_the_file(plain_folder, config_file, capsys, monkeypatch):
    path = plain_folder / config_file
    config = json.loads(path.read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel"}
    path.write_text(json.dumps(config))
    marker = plain_folder / "ran.txt"
    (plain_folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(InvalidInputError, match=rf"{config_file} has an auto_map"):
        folders.identify(plain_folder)
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("rankwise asked whether to run the folder's code"))
    for argv in (["eval", "ppl", "--model", str(plain_folder)], ["info", str(plain_folder)]):
        assert main(["--quiet", *argv]) == 2
        assert "never does" in capsys.readouterr().err
    assert not marker.exists()


def test_a_pickle_only_folder_is_refused_in_words(tmp_path, capsys):
    from rankwise.models import load_model, load_smollm2_tokenizer

    import torch

    model = tiny_llama(seed=0)
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()  # an older folder: the weights as a pickle only
    torch.save(model.state_dict(), tmp_path / "m" / "pytorch_model.bin")
    load_smollm2_tokenizer().save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "pytorch_model.bin").is_file() and not list((tmp_path / "m").glob("*.safetensors"))
    with pytest.raises(InvalidInputError, match="only pickled weights"):
        load_model(tmp_path / "m")
    assert main(["--quiet", "eval", "ppl", "--model", str(tmp_path / "m")]) == 2
    assert "does not unpickle" in capsys.readouterr().err


def test_a_safetensors_folder_still_loads(plain_folder):
    from rankwise.models import load_model

    model, tokenizer = load_model(plain_folder)
    assert model.config.model_type == "llama" and tokenizer is not None
