"""CARE GQA -> MLA conversion on tiny Llama models: full-rank exactness, KV parity, save/reload, bad input."""

import contextlib
import copy
import json
import logging

import pytest
import torch
from rounding import logits_tol
from transformers import LlamaForCausalLM

from rankwise.compress.mla import (
    LowRankLinear,
    activation_errors,
    apply_plan,
    convert_to_mla,
    decompose_kv,
    kv_input_moments,
    kv_parity_factors,
    kv_saving,
    latent_kv_elements_per_token,
    load_mla,
    mla_info,
    save_mla,
)
from rankwise.compress.mla.factorize import METHODS
from rankwise.errors import CorruptFileError, InvalidInputError, NumericalError
from rankwise.models import load_model, tiny_bert, tiny_llama

pytestmark = pytest.mark.method("care-mla")

KV_WIDTH = 32  # tiny_llama: 2 KV heads x head_dim 16


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def calibration():
    return torch.randint(0, 2000, (12, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def probe():
    return torch.randint(0, 2000, (2, 16), generator=torch.Generator().manual_seed(2))


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("method", sorted(METHODS))
def test_full_rank_conversion_keeps_the_logits(model, calibration, probe, method):
    decomposition = decompose_kv(model, method, calibration, damping=0.0, use_cache=False)
    converted = apply_plan(model, decomposition.plan(KV_WIDTH))
    assert isinstance(converted.model.layers[0].self_attn.k_proj, LowRankLinear)
    reference = logits(model, probe)
    assert torch.allclose(logits(converted, probe), reference, rtol=0, atol=logits_tol(model, reference))
    assert isinstance(model.model.layers[0].self_attn.k_proj, torch.nn.Linear)  # the original is untouched


def test_factors_shapes_ranks_and_kv_saving(model, calibration, probe):
    converted = convert_to_mla(model, 8, "care", "adjusted", calibration, use_cache=False)
    info = mla_info(converted)
    assert sum(info["k_ranks"]) == sum(info["v_ranks"]) == 2 * 8
    for layer, rk in zip(converted.model.layers, info["k_ranks"]):
        k = layer.self_attn.k_proj
        assert k.down.weight.shape == (rk, 64) and k.up.weight.shape == (KV_WIDTH, rk)
    assert latent_kv_elements_per_token(converted) == 32 and kv_saving(converted) == pytest.approx(0.75)
    assert latent_kv_elements_per_token(model) == 2 * 2 * KV_WIDTH
    joint = convert_to_mla(model, 8, "mha2mla")
    k, v = joint.model.layers[1].self_attn.k_proj, joint.model.layers[1].self_attn.v_proj
    assert k.rank == v.rank == 16 and torch.equal(k.down.weight, v.down.weight)  # one shared latent, equal cache
    assert kv_saving(joint) == pytest.approx(0.75)
    assert torch.isfinite(logits(converted, probe)).all()


def test_care_activation_error_at_most_svd_in_every_layer_without_damping(model, calibration):
    moments = kv_input_moments(model, calibration, use_cache=False)
    care = decompose_kv(model, "care", moments, damping=0.0).plan(6)
    plain = decompose_kv(model, "svd").plan(6)
    for c, s in zip(activation_errors(model, care, moments), activation_errors(model, plain, moments)):
        assert c.k <= s.k + 1e-9 and c.v <= s.v + 1e-9


def test_kv_parity_replication_gives_identical_attention(model, probe):
    """W^a = W_K and W^b = the 0/1 head-replication matrix turn the GQA layer into an exact MHA/MLA layer."""
    config = copy.deepcopy(model.config)
    config.num_key_value_heads = config.num_attention_heads
    mha = LlamaForCausalLM(config).eval()
    missing, unexpected = mha.load_state_dict(
        {k: v for k, v in model.state_dict().items() if ".k_proj." not in k and ".v_proj." not in k}, strict=False
    )
    assert not unexpected
    for gqa_layer, mha_layer in zip(model.model.layers, mha.model.layers):
        for name in ("k_proj", "v_proj"):
            w = getattr(gqa_layer.self_attn, name).weight.detach()
            down, up = kv_parity_factors(w, num_kv_heads=2, num_heads=4, head_dim=16)
            setattr(mha_layer.self_attn, name, LowRankLinear.from_factors(down, up))
    reference = logits(model, probe)
    assert torch.allclose(logits(mha, probe), reference, rtol=0, atol=logits_tol(model, reference))


@contextlib.contextmanager
def transformers_warnings():
    """The messages transformers logs inside the block (its logger does not propagate to pytest's caplog)."""
    from transformers.utils import logging as hf_logging

    heard: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record.getMessage())

    handler, logger = Keep(), hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    try:
        yield heard
    finally:
        logger.removeHandler(handler)


def test_save_and_reload_round_trips_the_logits_exactly(model, calibration, probe, tmp_path, tokenizer):
    converted = convert_to_mla(model, 8, "care", "adjusted", calibration, score="code", use_cache=False)
    folder = save_mla(converted, tmp_path / "mla", tokenizer)
    config = json.loads((folder / "config.json").read_text())
    assert config["rankwise_format"] == "mla-oneshot" and config["rankwise_mla"]["k_ranks"] == mla_info(converted)["k_ranks"]
    with transformers_warnings() as heard:
        reloaded, tok = load_model(folder)
    assert not [m for m in heard if "model of type" in m], heard  # no model_type warning on our own load
    assert torch.equal(logits(reloaded, probe), logits(converted, probe))
    assert tok is not None and len(tok) == len(tokenizer)
    # a stock class called directly finds no weights it knows (k_proj/v_proj would be random): it refuses
    with pytest.raises(OSError, match="no file named"):
        LlamaForCausalLM.from_pretrained(folder)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CorruptFileError):
        load_mla(folder)


def test_bad_model_or_rank_is_refused(model, calibration):
    with pytest.raises(InvalidInputError, match="Llama-family"):
        convert_to_mla(tiny_bert(), 4, "svd")
    for rank in (0, -3, KV_WIDTH, KV_WIDTH + 1):
        with pytest.raises(InvalidInputError, match="kv_rank"):
            convert_to_mla(model, rank, "svd")
    converted = convert_to_mla(model, 4, "svd")
    with pytest.raises(InvalidInputError, match="already converted"):
        convert_to_mla(converted, 4, "svd")
    with pytest.raises(KeyError):
        convert_to_mla(model, 4, "qr")


def test_bad_calibration_is_refused_and_nothing_is_changed(model, calibration, tmp_path):
    with pytest.raises(InvalidInputError, match="needs calibration"):
        convert_to_mla(model, 4, "care")
    with pytest.raises(InvalidInputError):
        convert_to_mla(model, 4, "care", calibration=torch.zeros(0, 8, dtype=torch.long))
    with pytest.raises(InvalidInputError, match="too short"):
        convert_to_mla(model, 4, "care", calibration=calibration[:1, :10], use_cache=False)
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.model.layers[0].input_layernorm.weight[3] = float("nan")
    before = {k: v.clone() for k, v in broken.state_dict().items()}
    with pytest.raises(NumericalError):
        convert_to_mla(broken, 4, "care", calibration=calibration, inplace=True, use_cache=False)
    assert isinstance(broken.model.layers[0].self_attn.k_proj, torch.nn.Linear)
    assert all(torch.equal(v, before[k]) or v.isnan().any() for k, v in broken.state_dict().items())
    with pytest.raises(InvalidInputError):
        save_mla(model, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_cli_converts_saves_and_reloads(model, tokenizer, tmp_path, capsys):
    from rankwise.cli import main

    source = tmp_path / "tiny"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    out = tmp_path / "converted"
    code = main(["--quiet", "convert", "mla", "--model", str(source), "--kv-rank", "8", "--method", "care", "--allocation", "adjusted",
                 "--calib-samples", "16", "--calib-seq-len", "16", "--eval-windows", "1", "--seq-len", "32", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "KV-cache saving: 75.0%" in printed and "before ->" in printed
    reloaded, _ = load_model(out)
    assert mla_info(reloaded)["method"] == "care" and sum(mla_info(reloaded)["k_ranks"]) == 16
    assert main(["--quiet", "convert", "mla", "--model", str(source), "--kv-rank", "32", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


@pytest.mark.real_model
def test_smollm2_care_beats_svd_on_activation_error(smollm2):
    model, tokenizer = smollm2
    from rankwise.compress.mla import calibration_windows
    from rankwise.data import token_windows

    moments = kv_input_moments(model, calibration_windows(token_windows(tokenizer, "calibration", 32), samples=32), use_cache=False)
    care = decompose_kv(model, "care", moments, damping=0.0).plan(48)
    plain = decompose_kv(model, "svd").plan(48)
    care_errors, svd_errors = activation_errors(model, care, moments), activation_errors(model, plain, moments)
    assert all(c.k <= s.k + 1e-9 and c.v <= s.v + 1e-9 for c, s in zip(care_errors, svd_errors))
    converted = apply_plan(model, care)
    assert kv_saving(converted) == pytest.approx(0.75)
    with torch.no_grad():
        assert torch.isfinite(converted(input_ids=torch.arange(100, 164)[None]).logits).all()
