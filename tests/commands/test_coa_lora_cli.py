"""`rankwise finetune --method coa-lora --procedure coa-lora`: writes the deployed configuration's quantized base and
its adjusted LoRA, which peft and rankwise load with equal outputs; bad procedure options are refused."""

import pytest
import torch

from rankwise.cli import main
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("coa-lora")
ARGS = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "coa-lora", "--rank", "4", "--top-k-layers", "1",
        "--grad-accum", "2", "--procedure", "coa-lora", "--checkpoint-every", "0", "--steps", "2", "--batch-size", "4",
        "--train-examples", "32", "--eval-examples", "16", "--seq-len", "16"]


@pytest.mark.real_model
def test_finetune_writes_a_reloadable_deployed_configuration(tmp_path):
    peft = pytest.importorskip("peft")
    from rankwise.adapters import load_adapter
    from rankwise.models import load_model
    from rankwise.training.tasks import SequenceClassifier

    out = tmp_path / "run"
    assert main([*ARGS, "--procedure-option", "bits=2,3,4,8", "--procedure-option", "search_every=1", "--out", str(out)]) == 0
    base, tok = load_model(out / "model")
    original, _ = load_model("minilm-l6")
    top = "encoder.layer.5.attention.self.query.weight"
    assert not torch.equal(dict(base.named_parameters())[top], dict(original.named_parameters())[top])  # quantized base
    theirs = peft.PeftModel.from_pretrained(SequenceClassifier(base, 12), out / "adapter")
    ours = load_adapter(SequenceClassifier(load_model(out / "model")[0], 12), out / "adapter")
    enc = tok(["The Eiffel tower is in Paris.", "Photosynthesis in plants"], padding=True, return_tensors="pt")
    assert_rounding_close(theirs(enc["input_ids"], enc["attention_mask"]), ours(enc["input_ids"], enc["attention_mask"]), ours)
    assert main([*ARGS, "--procedure-option", "bits=2,5", "--out", str(tmp_path / "bad")]) == 2
    assert main([*ARGS, "--checkpoint-every", "5", "--out", str(tmp_path / "ckpt")]) == 2  # not resumable
