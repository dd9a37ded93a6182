"""`rankwise finetune --method coa-lora --procedure coa-lora`: writes the deployed configuration's quantized base and
its adjusted LoRA, which peft and rankwise load with equal outputs; bad procedure options are refused."""

import pytest
import torch

from rankwise.cli import main
from peft_loading import logits_both_ways
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("coa-lora")
ARGS = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "coa-lora", "--rank", "4", "--top-k-layers", "1",
        "--grad-accum", "2", "--procedure", "coa-lora", "--checkpoint-every", "0", "--steps", "2", "--batch-size", "4",
        "--train-examples", "32", "--eval-examples", "16", "--seq-len", "16"]


@pytest.mark.real_model
def test_finetune_writes_a_reloadable_deployed_configuration(tmp_path):
    pytest.importorskip("peft")
    from rankwise.models import load_model

    out = tmp_path / "run"
    assert main([*ARGS, "--procedure-option", "bits=2,3,4,8", "--procedure-option", "search_every=1",
                 "--procedure-option", "n_starts=1", "--out", str(out)]) == 0  # one climb per search: the search path, cheaper
    base, tok = load_model(out / "model")
    original, _ = load_model("minilm-l6")
    top = "encoder.layer.5.attention.self.query.weight"
    assert not torch.equal(dict(base.named_parameters())[top], dict(original.named_parameters())[top])  # quantized base
    theirs, ours_logits, _, ours = logits_both_ways(out / "adapter", base=out / "model")
    assert_rounding_close(theirs, ours_logits, ours)
    assert main([*ARGS, "--procedure-option", "bits=2,5", "--out", str(tmp_path / "bad")]) == 2
    assert main([*ARGS, "--checkpoint-every", "5", "--out", str(tmp_path / "ckpt")]) == 2  # not resumable
