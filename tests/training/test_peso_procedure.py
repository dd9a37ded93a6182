"""`rankwise finetune --procedure peso`: two continual stages on a saved tiny Llama, through the CLI entry point."""

import json

import pytest
import torch

from rankwise.cli import main
from rankwise.models import load_smollm2_tokenizer, tiny_llama
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("peso")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("peso") / "tiny"
    tiny_llama(0, num_layers=1).save_pretrained(folder)
    load_smollm2_tokenizer().save_pretrained(folder)
    return folder


def args(model, out, *extra, rank="4", task="wiki-lm"):
    return ["--quiet", "finetune", "--model", str(model), "--task", task, "--method", "lora", "--rank", rank,
            "--targets", "q_proj,v_proj", "--steps", "2", "--batch-size", "2", "--train-examples", "8",
            "--eval-examples", "2", "--seq-len", "8", "--checkpoint-every", "0", "--lr", "1e-2", "--out", str(out), *extra]


def test_two_stages_inherit_anchor_and_load_in_peft(tiny_folder, tmp_path, capsys):
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rankwise.adapters import load_adapter

    s1, s2 = tmp_path / "stage1", tmp_path / "stage2"
    assert main(args(tiny_folder, s1)) == 0
    assert main(args(tiny_folder, s2, "--procedure", "peso", "--procedure-option", f"previous={s1 / 'adapter'}",
                     "--procedure-option", "lam=2", "--procedure-option", "proximal=kl")) == 0
    run = json.loads((s2 / "metrics.json").read_text())
    assert len(run["history"]) == 2
    ckpt_free = json.loads((s2 / "adapter" / "adapter_config.json").read_text())
    assert ckpt_free["peft_type"] == "LORA" and ckpt_free["r"] == 4
    # Inheritance: a third stage from stage 1 with another seed (another A initialisation, other batches) and a rate
    # of 1e-6 ends within 2 Adam steps of 1e-6 per entry of stage 1's factors; a fresh adapter (B = 0, a new A)
    # would be a whole factor's norm away from them.
    s3 = tmp_path / "stage3"
    assert main(args(tiny_folder, s3, "--procedure", "peso", "--procedure-option", f"previous={s1 / 'adapter'}",
                     "--seed", "1", "--lr", "1e-6")) == 0
    w1, w3 = load_file(s1 / "adapter" / "adapter_model.safetensors"), load_file(s3 / "adapter" / "adapter_model.safetensors")
    for key in w1:
        assert float(w1[key].norm()) > 0
        assert float((w3[key] - w1[key]).abs().max()) <= 2 * 1e-6 * 1.01, key
    # the PESO stage's adapter is a plain LoRA folder: peft and rankwise compute the same outputs
    ids = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(0))
    ours = load_adapter(AutoModelForCausalLM.from_pretrained(tiny_folder), s2 / "adapter")
    theirs = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_folder), s2 / "adapter")
    with torch.no_grad():
        assert_rounding_close(theirs(ids).logits, ours(ids).logits, ours)


def test_a_classifier_stage_continues_the_classifier_adapter_finetune_wrote(tiny_folder, tmp_path):
    # finetune saves a classifier's adapter under the classifier's module names ("model." + the base's): the next
    # stage, whose adapter sits inside a new classifier, inherits it rather than refusing a "different module set"
    s1, s2 = tmp_path / "stage1", tmp_path / "stage2"
    assert main(args(tiny_folder, s1, task="wiki-topics")) == 0
    assert main(args(tiny_folder, s2, "--procedure", "peso", "--procedure-option", f"previous={s1 / 'adapter'}",
                     task="wiki-topics")) == 0
    assert json.loads((s2 / "metrics.json").read_text())["history"]


def test_peso_stage_bad_input_is_a_clear_error(tiny_folder, tmp_path, capsys):
    s1 = tmp_path / "stage1"
    assert main(args(tiny_folder, s1)) == 0
    capsys.readouterr()
    prev = f"previous={s1 / 'adapter'}"
    assert main(args(tiny_folder, tmp_path / "a", "--procedure", "peso", "--procedure-option", prev, rank="2")) == 2
    assert "does not match" in capsys.readouterr().err
    assert main(args(tiny_folder, tmp_path / "b", "--procedure", "peso", "--procedure-option", prev,
                     "--procedure-option", "lamda=2")) == 2
    assert "no option(s) ['lamda']" in capsys.readouterr().err
    assert main(args(tiny_folder, tmp_path / "c", "--procedure", "peso")) == 2
    assert "needs --procedure-option previous" in capsys.readouterr().err
    assert main(args(tiny_folder, tmp_path / "d", "--procedure", "peso", "--procedure-option", prev,
                     "--procedure-option", "proximal=fisher")) == 2
    assert "proximal must be" in capsys.readouterr().err
    assert main(args(tiny_folder, tmp_path / "e", "--procedure", "peso", "--procedure-option", "previous=/nonexistent")) == 2
    assert "not a folder" in capsys.readouterr().err
