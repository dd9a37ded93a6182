"""PEFT compatibility: our LoRA equals peft's with the same seed; saved folders load in peft and round-trip exactly."""

import copy
import json

import pytest
import torch

from rankwise.adapters import LoraConfig, PicaConfig, add_adapter, load_adapter
from rankwise.core.io import MANIFEST_NAME
from rankwise.errors import CorruptFileError, InvalidInputError
from rankwise.models import tiny_bert, tiny_llama
from rounding import assert_rounding_close

peft = pytest.importorskip("peft")
TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]


def _ids(shape=(2, 12)):
    return torch.randint(0, 2000, shape, generator=torch.Generator().manual_seed(1))


def _peft_lora(model, **kw):
    return peft.get_peft_model(model, peft.LoraConfig(**kw))


def test_lora_matches_peft_same_seed_init_forward_and_training():
    torch.manual_seed(7)
    theirs = _peft_lora(tiny_llama(seed=0), r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0)
    torch.manual_seed(7)
    ours = add_adapter(tiny_llama(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    their_A = {n.replace("base_model.model.", "").replace(".lora_A.default.weight", ""): p
               for n, p in theirs.named_parameters() if "lora_A" in n}
    for name, adapter in ours.adapters_of("default").items():
        assert torch.equal(adapter.A, their_A[name]), name
    assert ours.count_parameters().trainable == theirs.get_nb_trainable_parameters()[0]
    ids = _ids()
    opt_ours = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad], lr=1e-2)
    opt_theirs = torch.optim.AdamW([p for p in theirs.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    # three AdamW steps on both: Adam's normalisation can amplify rounding-level gradient differences
    assert_rounding_close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, ours)


@pytest.mark.parametrize("kind", ["lora", "lora-pissa", "pica"])
def test_saved_folder_loads_in_peft_with_same_logits(kind, tmp_path):
    config = {
        "lora": LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS),
        "lora-pissa": LoraConfig(r=4, lora_alpha=16, init="pissa", target_modules=TARGETS, layers_to_transform=[1]),
        "pica": PicaConfig(r=8, target_modules=TARGETS),
    }[kind]
    base = tiny_llama(seed=0)
    model = add_adapter(copy.deepcopy(base), config)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    ids = _ids()
    expected = model(input_ids=ids).logits
    model.save(tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter")
    assert_rounding_close(theirs(input_ids=ids).logits, expected, base)  # peft's adapter arithmetic, not ours
    ours = load_adapter(copy.deepcopy(base), tmp_path / "adapter")
    assert torch.equal(ours(input_ids=ids).logits, expected)  # exact round trip


def test_load_folder_written_by_peft(tmp_path):
    torch.manual_seed(0)
    theirs = _peft_lora(tiny_bert(), r=2, lora_alpha=4, target_modules=["query", "value"])
    with torch.no_grad():
        for n, p in theirs.named_parameters():
            if "lora_B" in n:
                p.normal_()
    theirs.save_pretrained(tmp_path / "peft")
    ids = _ids((2, 9))
    ours = load_adapter(tiny_bert(), tmp_path / "peft")
    assert_rounding_close(ours(input_ids=ids).last_hidden_state, theirs(input_ids=ids).last_hidden_state, ours)


def test_different_base_is_a_clear_error(tmp_path):
    model = add_adapter(tiny_llama(hidden_size=64), PicaConfig(r=4, target_modules=["q_proj"]))
    model.save(tmp_path / "a")
    with pytest.raises(InvalidInputError, match=r"saved for a different model: .*model\.layers\.0\.self_attn\.q_proj"):
        load_adapter(tiny_llama(hidden_size=32), tmp_path / "a")
    with pytest.raises(InvalidInputError, match="saved for a different model: it adapts 'model.layers.0.self_attn.q_proj'"):
        load_adapter(tiny_bert(), tmp_path / "a")


def test_unknown_keys_warn_and_corruption_is_detected(tmp_path):
    model = add_adapter(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    folder = tmp_path / "a"
    model.save(folder)
    cfg = json.loads((folder / "rankwise_adapter.json").read_text())
    cfg["config"]["shiny_new_option"] = True
    (folder / "rankwise_adapter.json").write_text(json.dumps(cfg))
    (folder / MANIFEST_NAME).unlink()  # we edited the folder on purpose
    with pytest.warns(UserWarning, match="shiny_new_option"):
        load_adapter(tiny_llama(), folder)
    with pytest.raises(InvalidInputError, match="not written by rankwise"):  # without its manifest it is not ours to replace
        model.save(folder)
    folder = model.save(tmp_path / "b")
    weights = folder / "rankwise_adapter.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7])
    with pytest.raises(CorruptFileError):
        load_adapter(tiny_llama(), folder)
