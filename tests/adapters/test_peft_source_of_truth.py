"""Issue 17, items 6 and 15: the PEFT files are the source of truth of an adapter folder (rankwise and peft load
the same model when the manifest is missing or disagrees), and a classification head is saved the PEFT way
(modules_to_save), so `PeftModel.from_pretrained` restores the classifier."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from rankwise.adapters import LoraConfig, PicaConfig, add_adapter, load_adapter
from rankwise.core.io import MANIFEST_NAME
from rankwise.models import tiny_bert, tiny_llama
from rankwise.training import SequenceClassifier
from peft_loading import logits_both_ways
from rounding import assert_rounding_close

peft = pytest.importorskip("peft")
TARGETS = ["q_proj", "v_proj", "up_proj"]


def _ids(shape=(2, 10)):
    return torch.randint(0, 1000, shape, generator=torch.Generator().manual_seed(1))


def _saved(tmp_path, config=None):
    base = tiny_llama(seed=0, vocab_size=1000)
    torch.manual_seed(0)
    model = add_adapter(copy.deepcopy(base), config or LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return base, model.save(tmp_path / "adapter")


def _both(base, folder):
    ids = _ids()
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), folder)(input_ids=ids).logits
    ours = load_adapter(copy.deepcopy(base), folder)(input_ids=ids).logits
    return ours, theirs


def _edit_alpha(folder, alpha):
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["lora_alpha"] = alpha
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


def test_edited_peft_config_without_manifest_loads_what_peft_loads(tmp_path):
    base, folder = _saved(tmp_path)
    before, _ = _both(base, folder)
    (folder / MANIFEST_NAME).unlink()
    _edit_alpha(folder, 64.0)
    with pytest.warns(UserWarning, match="disagree with the PEFT files"):
        ours, theirs = _both(base, folder)
    assert_rounding_close(ours, theirs, base)
    assert (ours - before).abs().max() > 1e-3  # the edit matters: the old reading would differ from peft's


def test_edited_peft_config_with_a_disagreeing_manifest_loads_what_peft_loads(tmp_path):
    base, folder = _saved(tmp_path)
    _edit_alpha(folder, 2.0)
    with pytest.warns(UserWarning, match="SHA-256|bytes"):
        ours, theirs = _both(base, folder)
    assert_rounding_close(ours, theirs, base)


def test_edited_rankwise_weights_lose_to_the_peft_files(tmp_path):
    base, folder = _saved(tmp_path)
    (folder / MANIFEST_NAME).unlink()
    weights = folder / "rankwise_adapter.safetensors"
    tensors = load_file(weights)
    key = next(k for k in tensors if k.endswith(".B"))
    tensors[key] = tensors[key] + 1.0
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="disagree"):
        ours, theirs = _both(base, folder)
    assert_rounding_close(ours, theirs, base)


def test_an_untouched_folder_without_manifest_keeps_the_exact_rankwise_adapter(tmp_path):
    base, folder = _saved(tmp_path, PicaConfig(r=8, target_modules=TARGETS))
    expected = load_adapter(copy.deepcopy(base), folder)(input_ids=_ids()).logits
    (folder / MANIFEST_NAME).unlink()
    loaded = load_adapter(copy.deepcopy(base), folder)
    assert loaded.configs["default"].method == "pica"  # our files agree with the PEFT files: ours are used
    assert torch.equal(loaded(input_ids=_ids()).logits, expected)


def _classifier(seed=0):
    torch.manual_seed(seed)
    return SequenceClassifier(tiny_bert(), 5)


@pytest.mark.parametrize("config", [LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"]),
                                    PicaConfig(r=4, target_modules=["query", "value"])], ids=["lora", "pica"])
def test_a_classifier_head_saved_as_modules_to_save_is_restored_by_peft(tmp_path, config):
    trained = _classifier()
    adapted = add_adapter(trained.model, config)
    with torch.no_grad():
        for p in adapted.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
        trained.head.weight.add_(0.5)
    ids, mask = _ids((3, 7)), torch.ones(3, 7, dtype=torch.long)
    expected = trained(ids, mask)
    folder = adapted.save(tmp_path / "adapter", prefix="model.", modules_to_save={"head": trained.head})
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["modules_to_save"] == ["head"]
    assert {"base_model.model.head.weight", "base_model.model.head.bias"} <= set(load_file(folder / "adapter_model.safetensors"))
    theirs = peft.PeftModel.from_pretrained(_classifier(seed=1), folder)  # another head init: the saved one must win
    assert_rounding_close(theirs(ids, mask), expected, trained)
    ours = load_adapter(_classifier(seed=1), folder)
    assert torch.equal(ours(ids, mask), expected)
    with pytest.raises(Exception, match="modules to save"):
        load_adapter(tiny_bert(), folder)


@pytest.mark.real_model
def test_minilm_topics_finetune_head_loads_in_peft_with_the_same_logits(tmp_path):
    from rankwise.cli import main

    out = tmp_path / "run"
    assert main(["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "4",
                 "--steps", "2", "--batch-size", "4", "--train-examples", "16", "--eval-examples", "8", "--seq-len", "16",
                 "--lr", "0.05", "--out", str(out)]) == 0
    assert not (out / "head.safetensors").exists()  # in the adapter folder now
    a, b, random_head, ours = logits_both_ways(out / "adapter")
    assert_rounding_close(a, b, ours)
    assert (a - random_head).abs().max() > 1e-2  # the classifier was restored, not left at a fresh init


# -- issue 32, item 14: a hand-edited PEFT config is named, not a KeyError -----------------------------------------
@pytest.mark.parametrize("edit, says", [
    (lambda cfg: cfg.pop("r"), "lacks its field 'r'"),
    (lambda cfg: cfg.update(r="two"), "field 'r' must be an integer"),
    (lambda cfg: cfg.update(lora_alpha=[16]), "field 'lora_alpha' must be a number"),
    (lambda cfg: cfg.update(modules_to_save="head"), "field 'modules_to_save' must be a list"),
])
def test_a_hand_edited_peft_config_is_refused_naming_the_field(tmp_path, edit, says):
    from rankwise.errors import CorruptFileError

    base, folder = _saved(tmp_path)
    (folder / MANIFEST_NAME).unlink()  # so the PEFT files are what is read (the source of truth)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    edit(cfg)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CorruptFileError, match=says):
        load_adapter(copy.deepcopy(base), folder)
