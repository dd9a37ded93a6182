import pytest
import torch

from rankwise.core.io import write_manifest
from rankwise.errors import UnknownNameError
from rankwise.models import load_model, smollm2, tiny_llama


def _fake_build(calls):
    """Stand-in for the 25 s GGUF dequantization: writes a tiny Llama folder the same way."""

    def build(folder):
        calls.append(folder)
        from rankwise.core.io import atomic_dir
        from rankwise.models import load_smollm2_tokenizer

        with atomic_dir(folder) as tmp:
            tiny_llama(seed=1).save_pretrained(tmp)
            load_smollm2_tokenizer().save_pretrained(tmp)
            write_manifest(tmp)

    return build


def test_corrupt_cache_is_detected_and_rebuilt(tmp_cache, monkeypatch, tokenizer):
    calls = []
    monkeypatch.setattr(smollm2, "build_smollm2_cache", _fake_build(calls))
    load_model("smollm2-135m")
    assert len(calls) == 1
    load_model("smollm2-135m")
    assert len(calls) == 1, "a valid cache must be reused"
    weights = smollm2.smollm2_cache_folder() / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF  # flip bits: same size, different content
    weights.write_bytes(bytes(data))
    model, _ = load_model("smollm2-135m")
    assert len(calls) == 2, "a corrupted cache must be rebuilt, not used"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncate
    load_model("smollm2-135m")
    assert len(calls) == 3
    assert isinstance(model, torch.nn.Module)


def test_saved_folder_round_trips(tmp_path, tokenizer):
    model = tiny_llama(seed=2)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_model(tmp_path)
    ids = torch.randint(0, 1000, (1, 12))
    assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(UnknownNameError, match="neither an embedded model"):
        load_model("gpt-2")


def test_tiny_llama_is_gqa_like_smollm2():
    model = tiny_llama()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert model.config.vocab_size == 49152 and model.config.tie_word_embeddings


@pytest.mark.real_model
def test_smollm2_loads_with_expected_architecture(smollm2):
    model, tok = smollm2
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (30, 576, 9, 3)
    assert model.dtype == torch.float32 and tok.chat_template


@pytest.mark.real_model
def test_minilm_embeddings_are_normalised():
    from rankwise.models import embed_sentences

    model, tok = load_model("minilm-l6")
    emb = embed_sentences(model, tok, ["A cat sits on the mat.", "A feline rests on a rug.", "Stock markets fell."])
    assert emb.shape == (3, 384)
    # float32: the worst-case rounding of a 384-term sum of squares (and of the division before it) is ~384 eps / 2
    assert torch.allclose(emb.norm(dim=-1), torch.ones(3), rtol=0, atol=emb.size(-1) * torch.finfo(torch.float32).eps)
    assert emb[0] @ emb[1] > emb[0] @ emb[2]


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2-135m", "minilm-l6"])
def test_the_embedded_records_sizes_are_the_loaded_models(name):
    """Issue 32, item 13: `--kv-rank`, `--optimizer-rank` and layer indices are bounded by the record's sizes before
    the model loads; they must be the model's own."""
    from rankwise.models.embedded import EMBEDDED_MODELS

    model, _ = load_model(name)
    dims = EMBEDDED_MODELS[name].dims
    assert dims and {k: getattr(model.config, k) for k in dims} == dims
