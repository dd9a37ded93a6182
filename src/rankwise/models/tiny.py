"""Tiny randomly initialised models for tests and smoke runs, built on the same classes as the real ones."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

SMOLLM2_VOCAB = 49152


def tiny_llama(
    seed: int = 0,
    vocab_size: int = SMOLLM2_VOCAB,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    tie_word_embeddings: bool = True,
) -> LlamaForCausalLM:
    """A GQA Llama like SmolLM2 (tied embeddings, RoPE theta 1e5, the SmolLM2 vocabulary) but a few layers wide.

    head_dim = hidden_size // num_heads. Returns an fp32 model in eval mode.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=2048,
        rope_theta=1e5,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float().eval()


def tiny_bert(seed: int = 0, vocab_size: int = 30522, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 2) -> BertModel:
    """A BERT encoder shaped like MiniLM (same vocabulary) but tiny. fp32, eval mode."""
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=hidden_size * 4,
        max_position_embeddings=512,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = BertModel(config)
    return model.float().eval()


def smollm2_stand_in(seed: int = 0, **shape) -> tuple[LlamaForCausalLM, object]:
    """SmolLM2's smoke stand-in: a tiny random Llama with SmolLM2's real tokenizer (the same data path)."""
    from rankwise.models.smollm2 import load_smollm2_tokenizer

    return tiny_llama(seed=seed, **shape), load_smollm2_tokenizer()


def minilm_stand_in(seed: int = 0, **shape) -> tuple[BertModel, object]:
    """MiniLM's smoke stand-in: a tiny random BERT with MiniLM's real tokenizer."""
    from transformers import AutoTokenizer

    from rankwise.models.minilm import minilm_folder

    return tiny_bert(seed=seed, **shape), AutoTokenizer.from_pretrained(minilm_folder())
