"""The stand-in data: procedural 32x32 "attribute images" with concept labels, and MiniLM embeddings of the concept
texts (card ivq-concept-bottleneck.md, CPU-scale reproduction).

Each image holds one main object with four concept groups -- shape {circle, square, triangle}, colour {red, green,
blue}, texture {plain, striped, dotted}, size {small, large} (11 values) -- at a random place, plus 2-3 small plain
distractor objects of random shape and colour, on a noisy grey background, so the evidence is spread over patches
and the colour concept needs the main object, not any red pixel. The 6 classes are a rule over the attributes,

    class = (shape + colour) mod 3 + 3 * [texture == striped  XOR  size == large],

so no single concept decides the class. The proxy task the ViT is pretrained on (before any CBM), on other images,
is the main object's shape x colour (9 classes): like a CLIP trunk that already knows some visual words, it knows
two of the four groups, while texture, size and the class rule are new at fine-tuning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUPS = ("shape", "colour", "texture", "size")
VALUES = (("circle", "square", "triangle"), ("red", "green", "blue"), ("plain", "striped", "dotted"), ("small", "large"))
NUM_CLASSES = 6
SIZE = 32
_COLOURS = np.array([[0.9, 0.15, 0.1], [0.15, 0.8, 0.2], [0.15, 0.3, 0.95]])
_RADIUS = {0: 5, 1: 8}  # small, large
PROMPT = "an object whose {group} is {value}"


def class_rule(concepts: np.ndarray) -> np.ndarray:
    """concepts int [N, 4] (shape, colour, texture, size) -> class int [N] in 0..5 (the module docstring's rule)."""
    s, c, t, z = concepts.T
    return (s + c) % 3 + 3 * ((t == 1) ^ (z == 1)).astype(np.int64)


def _mask(shape: int, cx: float, cy: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    if shape == 0:
        return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    if shape == 1:
        return (np.abs(xx - cx) <= r * 0.85) & (np.abs(yy - cy) <= r * 0.85)
    # an upward triangle inside the circle of radius r
    return (yy <= cy + r * 0.8) & (yy - (cy - r) >= 1.8 * np.abs(xx - cx))


def _texture(kind: int) -> np.ndarray:
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    if kind == 1:
        return ((yy // 2) % 2 == 0).astype(np.float64)  # horizontal stripes two pixels wide
    if kind == 2:
        return ((yy % 3 == 0) & (xx % 3 == 0)).astype(np.float64)  # a dot every third pixel
    return np.zeros((SIZE, SIZE))


def render(concepts: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int, bool]:
    """One image float32 [3, 32, 32] in [0, 1] for concepts (shape, colour, texture, size); returns it with the
    number of distractors and whether the main object is in the left half."""
    shape, colour, texture, size = (int(v) for v in concepts)
    img = 0.45 + 0.05 * rng.standard_normal((SIZE, SIZE, 3))
    r = _RADIUS[size]
    cx, cy = rng.uniform(r + 1, SIZE - r - 2, size=2)
    n_distract = int(rng.integers(2, 4))
    for _ in range(n_distract):  # small plain objects first, so the main object is drawn over them
        m = _mask(int(rng.integers(3)), *rng.uniform(3, SIZE - 4, size=2), 2.5)
        img[m] = _COLOURS[int(rng.integers(3))] * 0.8
    m = _mask(shape, cx, cy, r)
    tex = _texture(texture)[..., None]
    base = _COLOURS[colour]
    img[m] = (base * (1 - 0.6 * tex) + 0.6 * tex * np.array([0.95, 0.95, 0.95]))[m]
    return np.clip(img, 0, 1).transpose(2, 0, 1).astype(np.float32), n_distract, bool(cx < SIZE / 2)


@dataclass(frozen=True)
class AttributeImages:
    """images float32 [N, 3, 32, 32] in [0, 1], concepts int64 [N, 4], classes int64 [N], proxy labels int64 [N] (3 x shape + colour)."""

    images: torch.Tensor
    concepts: torch.Tensor
    classes: torch.Tensor
    proxy: torch.Tensor


def attribute_images(n: int, seed: int) -> AttributeImages:
    """n images drawn by `seed` (concepts uniform over the 54 combinations)."""
    rng = np.random.default_rng(seed)
    concepts = np.stack([rng.integers(len(v), size=n) for v in VALUES], axis=1)
    images, proxy = np.empty((n, 3, SIZE, SIZE), np.float32), np.empty(n, np.int64)
    for i in range(n):
        images[i], _, _ = render(concepts[i], rng)
    proxy[:] = 3 * concepts[:, 0] + concepts[:, 1]
    return AttributeImages(torch.from_numpy(images), torch.from_numpy(concepts.astype(np.int64)),
                           torch.from_numpy(class_rule(concepts)), torch.from_numpy(proxy))


@dataclass(frozen=True)
class ProxyImages:
    """What `pretrained_backbone` reads: images and labels (the proxy task's)."""

    images: torch.Tensor
    labels: torch.Tensor


def concept_embeddings(size: str, seed: int) -> tuple[list[torch.Tensor], str]:
    """Per group, the mean-pooled, L2-normalised sentence embeddings [n_k, 384] of "an object whose {group} is
    {value}": the embedded all-MiniLM-L6-v2 at full, a tiny random BERT of the family at smoke. Returns them with
    the encoder's description."""
    from rankwise.models import embed_sentences
    from rankwise.repro.setup import experiment_model

    model, tokenizer = experiment_model("minilm-l6", size, seed)
    texts = [PROMPT.format(group=g, value=v) for g, vals in zip(GROUPS, VALUES) for v in vals]
    with torch.no_grad():
        emb = embed_sentences(model, tokenizer, texts)
    return list(torch.split(emb, [len(v) for v in VALUES])), ("all-MiniLM-L6-v2" if size == "full" else "tiny random BERT (smoke)")
