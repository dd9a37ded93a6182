"""What a finetune run folder holds after a refusal or a rerun with another method (issue 32, item 17)."""

import pytest

from rankwise.cli import main
from rankwise.models import load_smollm2_tokenizer, tiny_llama

TRAIN = ["--quiet", "finetune", "--task", "wiki-lm", "--steps", "1", "--batch-size", "2", "--seq-len", "16",
         "--train-examples", "8", "--eval-examples", "2", "--eval-every", "0", "--checkpoint-every", "0"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base") / "tiny"
    tiny_llama(seed=0, num_layers=1).save_pretrained(folder)
    load_smollm2_tokenizer().save_pretrained(folder)
    return str(folder)


def test_a_run_refused_after_the_model_loaded_leaves_no_folder(model, tmp_path, capsys):
    out = tmp_path / "run"
    # refused by the procedure's builder, which needs the task (8 examples cannot feed 20 clients)
    argv = ["--quiet", "finetune", "--model", model, "--task", "wiki-topics", "--method", "lora", "--rank", "2",
            "--procedure", "la-lora", "--procedure-option", "clients=20", "--train-examples", "8", "--eval-examples", "2",
            "--seq-len", "16", "--checkpoint-every", "0", "--out", str(out)]
    assert main(argv) == 2
    assert "20 clients" in capsys.readouterr().err
    assert not out.exists()


def test_a_refusal_keeps_a_folder_the_user_already_had(model, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    argv = ["--quiet", "finetune", "--model", model, "--task", "wiki-topics", "--method", "lora", "--rank", "2",
            "--procedure", "la-lora", "--procedure-option", "clients=20", "--train-examples", "8", "--eval-examples", "2",
            "--seq-len", "16", "--checkpoint-every", "0", "--out", str(out)]
    assert main(argv) == 2
    assert out.is_dir()


def test_rerunning_with_full_fine_tuning_drops_the_earlier_adapter(model, tmp_path):
    out = tmp_path / "run"
    assert main([*TRAIN, "--model", model, "--method", "lora", "--rank", "2", "--out", str(out)]) == 0
    assert (out / "adapter").is_dir()
    assert main([*TRAIN, "--model", model, "--method", "full", "--no-resume", "--out", str(out)]) == 0
    assert (out / "model").is_dir() and not (out / "adapter").exists()
    assert main([*TRAIN, "--model", model, "--method", "lora", "--rank", "2", "--no-resume", "--out", str(out)]) == 0
    assert (out / "adapter").is_dir() and not (out / "model").exists()
