"""The embedded models: one record each, the only table of them (the loader, `rankwise info`, the reproductions'
smoke stand-ins and the CLI's `--model` checks all read it). Torch-free, so the CLI can check a model name before
any heavy import; loaders and stand-ins are "module:function" targets resolved on use.

A new embedded model (a package that ships weights, or a backbone pretrained here once and cached) adds a record:
its loader returns (model, tokenizer-or-None) offline, and its smoke stand-in builds a tiny random model of the
same classes for smoke runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EmbeddedModel:
    name: str  # what `--model NAME` and `load_model(NAME)` take
    summary: str  # what it is, for `rankwise info` and error messages
    causal: bool  # a causal language model (has an LM head)
    model_type: str  # the transformers model_type (its architecture's default adapter targets follow from it)
    loader: str  # "module:function" () -> (model, tokenizer)
    smoke: str  # "module:function" (seed, **shape) -> (model, tokenizer): the tiny stand-in of smoke runs
    smoke_shape: dict[str, Any] = field(default_factory=dict)  # the stand-in's default shape
    inputs: str = "text"  # what it reads: "text" (token ids; it comes with a tokenizer) or "images" [B, C, H, W]
    image_size: int | None = None  # the side its images must have (inputs "images")
    context: int | None = None  # the longest token sequence it takes (its position embeddings), for text models
    # Its config.json's sizes (hidden_size, num_key_value_heads, head_dim, ...), so that a rank or a layer index that
    # cannot fit is refused before the model loads (`models.folders.model_dims`); empty: not known up front.
    dims: dict[str, int] = field(default_factory=dict)


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {m.name: m for m in (
    EmbeddedModel("smollm2-135m", "causal language model (SmolLM2-135M-Instruct, Llama architecture)", True, "llama",
                  "rankwise.models.smollm2:load_smollm2", "rankwise.models.tiny:smollm2_stand_in", {"num_layers": 2},
                  context=8192, dims={"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                                      "num_key_value_heads": 3, "head_dim": 64, "num_hidden_layers": 30}),
    EmbeddedModel("minilm-l6", "sentence encoder (all-MiniLM-L6-v2, BERT architecture)", False, "bert",
                  "rankwise.models.minilm:load_minilm", "rankwise.models.tiny:minilm_stand_in", context=512,
                  dims={"hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 12, "num_hidden_layers": 6}),
    # No pretrained vision weights exist offline: these are pretrained here once (rankwise.models.vision) and cached.
    EmbeddedModel("tiny-vit-fmnist-0to4", "vision transformer (28x28, 16 patches, width 64) pretrained here on "
                  "Fashion-MNIST classes 0-4", False, "tiny-vit", "rankwise.models.vision:load_tiny_vit_fmnist",
                  "rankwise.models.vision:tiny_vit_stand_in", inputs="images", image_size=28),
    EmbeddedModel("resnet-small-fmnist", "small ResNet (16/32/64 channels, batch norm) pretrained here on "
                  "Fashion-MNIST at 14x14", False, "resnet-small", "rankwise.models.vision:load_resnet_small_fmnist",
                  "rankwise.models.vision:resnet_small_stand_in", inputs="images", image_size=14),
)}
