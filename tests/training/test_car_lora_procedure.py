"""`rankwise finetune --method lora --procedure car-lora` on a saved tiny Llama: the run records its operators, the
adapter folder is a plain LoRA that peft loads with the same outputs, and bad options fail before any training."""

import json

import pytest
import torch

from rankwise.cli import main
from rankwise.models import load_smollm2_tokenizer, tiny_llama
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("portable-adapter")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("car") / "tiny"
    tiny_llama(0, num_layers=3).save_pretrained(folder)
    load_smollm2_tokenizer().save_pretrained(folder)
    return folder


def args(model, out, *extra):
    return ["--quiet", "finetune", "--model", str(model), "--task", "wiki-lm", "--method", "lora", "--rank", "4",
            "--top-k-layers", "2", "--steps", "3", "--batch-size", "2", "--train-examples", "8", "--eval-examples", "2",
            "--seq-len", "8", "--checkpoint-every", "0", "--lr", "1e-2", "--out", str(out), *extra]


def test_finetune_with_car_lora_saves_a_lora_that_peft_loads(tiny_folder, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from rankwise.adapters import load_adapter

    out = tmp_path / "car"
    assert main(args(tiny_folder, out, "--procedure", "car-lora", "--procedure-option", "operators=int8,nf4,fp4,prune,skip",
                     "--checkpoint-every", "3")) == 0
    run = json.loads((out / "checkpoint" / "trainer.json").read_text())["run"]
    assert run["operators"] == ["int8", "nf4", "fp4", "prune", "skip"] and run["compressed_layers"] == [1, 2]
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["peft_type"] == "LORA"
    ids = torch.randint(0, 2000, (2, 7), generator=torch.Generator().manual_seed(0))
    ours = load_adapter(AutoModelForCausalLM.from_pretrained(tiny_folder), out / "adapter")
    theirs = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_folder), out / "adapter")
    assert_rounding_close(theirs(input_ids=ids).logits, ours(input_ids=ids).logits, ours)


@pytest.mark.parametrize("option, match", [
    ("operators=int8,bogus", "unknown compression operator"),
    ("rate=3", "no option"),
    ("skip_layers=0", "among the compressed layers"),
])
def test_bad_car_lora_options_are_clear_errors(tiny_folder, tmp_path, capsys, option, match):
    assert main(args(tiny_folder, tmp_path / "x", "--procedure", "car-lora", "--procedure-option", option)) == 2
    assert match in capsys.readouterr().err
