"""Two small vision backbones, and the named Fashion-MNIST pretrainings the vision methods start from.

No pretrained vision weights exist offline: no package ships a ViT, ResNet, MobileNet or CLIP (DESIGN.md, offline
resources). So the methods that fine-tune, adapt or probe a pretrained image model (WASI, TraDy, DFA feedback
matching, EMAC-AUTTA, ...) start from a backbone pretrained here, once, deterministically, and cached:

    vit = pretrained_backbone("tiny-vit-fmnist-0to4")               # TinyViT pretrained on classes 0-4 of
                                                                    # Fashion-MNIST's train part (or pass data=)
    model, _ = rankwise.models.load_model("tiny-vit-fmnist-0to4")   # the same module, as an embedded model
    vit.module(images)                                              # [B, 1, 28, 28] -> logits [B, 5]
    vit.held_out_accuracy, vit.train_indices                        # which train images it saw (exclude them)

What this stand-in changes from an ImageNet backbone: a few hundred thousand parameters instead of 20-90 million;
one grey 28x28 (or 14x14) domain of 10 garment classes instead of 1,000 natural-image classes at 224x224; minutes of
pretraining on 10k images instead of days on 1.3M. Its features are therefore far less general: "transfer" here
means classes 0-4 -> 5-9 of the same domain, or Fashion-MNIST -> digits, not ImageNet -> CUB. Effects that need rich
pretrained features (stable low-rank activation subspaces, large gaps between fine-tuning arms) may be weaker.

Backbones (plain nn.Modules, every weight an nn.Linear or conv in torch's [out, in] layout):
- `TinyViT`: 28x28 input, 7x7 patches (16 tokens + CLS), width 64, 4 pre-norm blocks (4 heads, MLP 256).
- `SmallResNet`: a 3x3 stem and three stages of basic blocks at 16/32/64 channels with batch norm, average pooling.
- `FullyConnectedNet` ("mlp"): flatten, tanh hidden layers, a linear head (feedback-alignment methods' setting).
All have `features(x) -> [B, width]` (the penultimate representation) and a replaceable linear `head`.

Pretraining runs the project's one training loop (`rankwise.core.training.train`: AdamW, warmup + cosine,
clipping, fixed batch order from the seed) and is cached (`core.cache`) under a key of the whole recipe and a
SHA-256 of the images and labels it used, so a second call loads the weights (safetensors) instead of training.
The same recipe on the same data gives the same weights on one machine; on another CPU rounding may differ, and
the cache keeps the first run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, read_json, save_tensors_atomic, write_json_atomic
from rankwise.core.progress import say
from rankwise.core.training import TrainConfig, train  # the one training loop (kept to this one import)
from rankwise.core.training.tensor_tasks import TensorClassificationTask
from rankwise.errors import CorruptFileError, InvalidInputError, UnknownNameError

CACHE_NAMESPACE = "vision-backbones"
CACHE_VERSION = 1


# -------------------------------------------------------------------------------------------------------- TinyViT


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise InvalidInputError(f"width {dim} must be a multiple of the {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # each [B, H, T, D/H]
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then + mlp(norm2(x))."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _Mlp(dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """A vision transformer for small images: [B, C, H, W] -> logits [B, num_classes].

    Non-overlapping patch x patch patches, each flattened (C * patch^2 values) and embedded by a Linear (`embed`);
    a learned CLS token and position embeddings; `depth` pre-norm blocks (`blocks[i].attn.qkv / .proj`,
    `blocks[i].mlp.fc1 / .fc2`, all nn.Linear); a final LayerNorm; `head` on the CLS token."""

    def __init__(self, num_classes: int = 10, image_size: int = 28, patch_size: int = 7, in_channels: int = 1,
                 dim: int = 64, depth: int = 4, heads: int = 4, mlp_dim: int = 256) -> None:
        super().__init__()
        if image_size % patch_size:
            raise InvalidInputError(f"image_size {image_size} must be a multiple of patch_size {patch_size}")
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.num_patches = (image_size // patch_size) ** 2
        self.embed = nn.Linear(in_channels * patch_size**2, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_patches + 1, dim))
        self.blocks = nn.ModuleList(_Block(dim, heads, mlp_dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    @property
    def width(self) -> int:
        return self.head.in_features

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, num_patches, C * patch^2], patches in row-major order."""
        b, c, h, w = x.shape
        if (c, h, w) != (self.in_channels, self.image_size, self.image_size):
            raise InvalidInputError(f"TinyViT takes [B, {self.in_channels}, {self.image_size}, {self.image_size}] images, "
                                    f"got {tuple(x.shape)} (resize them first)")
        p = self.patch_size
        return x.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The final token states [B, 1 + num_patches, width] (CLS first), after the last LayerNorm."""
        t = self.embed(self.patches(x))
        t = torch.cat([self.cls_token.expand(t.size(0), -1, -1), t], dim=1) + self.pos_embed
        for block in self.blocks:
            t = block(t)
        return self.norm(t)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The CLS representation [B, width] the head reads."""
        return self.tokens(x)[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# ---------------------------------------------------------------------------------------------------- SmallResNet


class _BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus the input (through a 1x1 conv + BN where the shape changes), then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A CIFAR-style ResNet for small images: [B, C, H, W] (any H, W >= 4) -> logits [B, num_classes].

    `stem` (3x3 conv + BN + ReLU at channels[0]), `stages[i]` of `blocks_per_stage` basic blocks at channels[i]
    (stride 1, 2, 2: a 14x14 input is seen at 14, 7 and 4 pixels), global average pooling, linear `head`."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, channels: tuple[int, ...] = (16, 32, 64),
                 blocks_per_stage: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, channels[0], 3, 1, 1, bias=False), nn.BatchNorm2d(channels[0]), nn.ReLU())
        stages, previous = [], channels[0]
        for i, width in enumerate(channels):
            blocks = [_BasicBlock(previous if j == 0 else width, width, (1 if i == 0 else 2) if j == 0 else 1)
                      for j in range(blocks_per_stage)]
            stages.append(nn.Sequential(*blocks))
            previous = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(previous, num_classes)

    @property
    def width(self) -> int:
        return self.head.in_features

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled representation [B, channels[-1]] the head reads."""
        if x.dim() != 4:
            raise InvalidInputError(f"SmallResNet takes [B, C, H, W] images, got {tuple(x.shape)}")
        return self.stages(self.stem(x)).mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# ------------------------------------------------------------------------------------------ fully connected net


class FullyConnectedNet(nn.Module):
    """[B, C, H, W] -> flatten -> `depth - 1` x (Linear, Tanh) at `hidden` units (`body`) -> Linear `head`:
    `depth` weight layers in all (784 -> 256 x (depth-1) -> classes by default): the setting of feedback-alignment
    methods (DFA feedback matching), whose updates are defined layer by layer on a plain chain."""

    def __init__(self, num_classes: int = 10, image_size: int = 28, in_channels: int = 1, hidden: int = 256,
                 depth: int = 6) -> None:
        super().__init__()
        if depth < 2:
            raise InvalidInputError(f"a fully connected net needs depth >= 2 (a hidden layer and a head), got {depth}")
        layers: list[nn.Module] = []
        width = in_channels * image_size * image_size
        for _ in range(depth - 1):
            layers += [nn.Linear(width, hidden), nn.Tanh()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    @property
    def width(self) -> int:
        return self.head.in_features

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> the last hidden layer's output [B, hidden]."""
        return self.body(x.flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


ARCHITECTURES: dict[str, type[nn.Module]] = {"tiny-vit": TinyViT, "resnet-small": SmallResNet, "mlp": FullyConnectedNet}


# ---------------------------------------------------------------------------------------------------- pretraining


class LabelledImages(Protocol):
    """What pretraining reads: `rankwise.data.vision.ImageSet` (Fashion-MNIST's train part), or any object with
    images float32 [N, 1, 28, 28] in [0, 1] and labels int64 [N]."""

    images: torch.Tensor
    labels: torch.Tensor


@dataclass(frozen=True)
class BackboneRecipe:
    """Everything a pretraining depends on besides the data (which the cache key hashes): the architecture and its
    arguments, the classes (relabelled 0..k-1 in this order), the image size, how many images train and how many
    are held out (drawn from those classes by `seed`), and the loop's settings."""

    name: str
    architecture: str
    model: dict[str, Any]
    classes: tuple[int, ...]
    image_size: int
    num_train: int
    num_eval: int
    epochs: int
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_ratio: float = 0.1
    seed: int = 0

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.epochs * self.num_train / self.batch_size))

    def build(self) -> nn.Module:
        """A freshly initialised module, seeded by `seed` (the caller's global RNG is left as it was)."""
        if self.architecture not in ARCHITECTURES:
            raise UnknownNameError(f"unknown architecture {self.architecture!r}; known: {list(ARCHITECTURES)}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            module = ARCHITECTURES[self.architecture](num_classes=len(self.classes), **self.model)
        describe_backbone(module, self.architecture, len(self.classes), self.model, self.image_size)
        return module


RECIPES: dict[str, BackboneRecipe] = {
    # WASI's source model (and other fine-tuning methods'): pretrain on classes 0-4, fine-tune on 5-9.
    "tiny-vit-fmnist-0to4": BackboneRecipe(
        name="tiny-vit-fmnist-0to4", architecture="tiny-vit", model={}, classes=tuple(range(5)), image_size=28,
        num_train=20_000, num_eval=2_000, epochs=4, lr=1e-3, weight_decay=0.05),
    # TraDy's (and EMAC-AUTTA's) CNN with batch norm: all 10 classes at 14x14.
    "resnet-small-fmnist": BackboneRecipe(
        name="resnet-small-fmnist", architecture="resnet-small", model={}, classes=tuple(range(10)), image_size=14,
        num_train=20_000, num_eval=2_000, epochs=4, lr=2e-3, weight_decay=1e-4),
}


@dataclass(frozen=True)
class PretrainedBackbone:
    """A pretrained module (in eval mode) with its recipe, its accuracy on the held-out images, the wall time its
    pretraining took (when it was first run), and the indices into the given data it trained and was scored on."""

    name: str
    module: nn.Module
    recipe: BackboneRecipe
    held_out_accuracy: float
    pretrain_seconds: float
    train_indices: torch.Tensor  # int64 [num_train]
    eval_indices: torch.Tensor  # int64 [num_eval]
    from_cache: bool = False
    history: list[dict[str, float]] = field(default_factory=list, repr=False)  # per-step losses of the pretraining


def pretrained_backbone(name: str | BackboneRecipe, data: LabelledImages | None = None, use_cache: bool = True) -> PretrainedBackbone:
    """The backbone of recipe `name` (a key of RECIPES, or a BackboneRecipe) pretrained on `data` (default:
    Fashion-MNIST's train part, `rankwise.data.vision.load_fashion_mnist("train")`): trained on the first call,
    loaded from the cache afterwards."""
    recipe = _recipe(name)
    if data is None:
        from rankwise.data.vision import load_fashion_mnist

        data = load_fashion_mnist("train")
    train_idx, eval_idx = _draw(data.labels, recipe)
    x_train, y_train = _prepare(data, train_idx, recipe)
    x_eval, y_eval = _prepare(data, eval_idx, recipe)
    key = cache_key(recipe=dataclasses.asdict(recipe), data=_fingerprint(x_train, y_train, x_eval, y_eval),
                    version=CACHE_VERSION)
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            return _load(entry, recipe, train_idx, eval_idx)
        except (CorruptFileError, KeyError, RuntimeError, TypeError):
            pass  # another version's layout (or a state dict that no longer fits): pretrain again
    say(f"pretraining {recipe.name} on {recipe.num_train} images ({recipe.steps} steps; cached afterwards)")
    module = recipe.build()
    task = TensorClassificationTask(f"pretrain-{recipe.name}", x_train, y_train, x_eval, y_eval)
    config = TrainConfig(steps=recipe.steps, batch_size=recipe.batch_size, lr=recipe.lr, weight_decay=recipe.weight_decay,
                         warmup_ratio=recipe.warmup_ratio, seed=recipe.seed)
    t0 = time.perf_counter()
    result = train(module, task, config)
    seconds = time.perf_counter() - t0
    module.eval()
    accuracy = float(result.final["accuracy"])
    if use_cache:
        meta = {"recipe": dataclasses.asdict(recipe), "held_out_accuracy": accuracy, "pretrain_seconds": seconds,
                "history": result.history}
        store_entry(CACHE_NAMESPACE, key, lambda tmp: _save(tmp, module, meta))
    return PretrainedBackbone(recipe.name, module, recipe, accuracy, seconds, train_idx, eval_idx, False, result.history)


def _recipe(name: str | BackboneRecipe) -> BackboneRecipe:
    if isinstance(name, BackboneRecipe):
        return name
    if name not in RECIPES:
        raise UnknownNameError(f"unknown pretrained backbone {name!r}; the recipes are {list(RECIPES)}")
    return RECIPES[name]


def _draw(labels: torch.Tensor, recipe: BackboneRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """Disjoint train and held-out indices (ascending) among the images of `recipe.classes`, drawn by its seed."""
    if labels.dim() != 1 or labels.dtype != torch.int64:
        raise InvalidInputError(f"labels must be int64 [N], got {labels.dtype} {tuple(labels.shape)}")
    pool = torch.isin(labels, torch.tensor(recipe.classes)).nonzero().squeeze(1)
    need = recipe.num_train + recipe.num_eval
    if pool.numel() < need:
        raise InvalidInputError(f"{recipe.name} needs {need} images of classes {list(recipe.classes)}, the data has "
                                f"{pool.numel()}: pass Fashion-MNIST's train part (60,000 images), or a smaller recipe")
    chosen = pool[torch.randperm(pool.numel(), generator=torch.Generator().manual_seed(recipe.seed))[:need]]
    return torch.sort(chosen[: recipe.num_train]).values, torch.sort(chosen[recipe.num_train :]).values


def _prepare(data: LabelledImages, indices: torch.Tensor, recipe: BackboneRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """The images at `indices` at recipe.image_size and their labels relabelled 0..k-1 in recipe.classes' order."""
    x = data.images[indices]
    if x.dim() != 4 or x.dtype != torch.float32:
        raise InvalidInputError(f"images must be float32 [N, C, H, W], got {x.dtype} {tuple(x.shape)}")
    size = recipe.image_size
    if x.shape[-2:] != (size, size):
        h, w = x.shape[-2:]
        if h % size or w % size:
            raise InvalidInputError(f"{recipe.name} reduces {h}x{w} images to {size}x{size} by block averaging: "
                                    "the sizes must divide")
        x = F.avg_pool2d(x, (h // size, w // size))  # as rankwise.data.vision.resize_images does for whole factors
    mapping = torch.full((max(int(data.labels.max()), *recipe.classes) + 1,), -1, dtype=torch.int64)
    mapping[torch.tensor(recipe.classes)] = torch.arange(len(recipe.classes))
    return x.contiguous(), mapping[data.labels[indices]]


def _fingerprint(*tensors: torch.Tensor) -> str:
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(str((t.dtype, tuple(t.shape))).encode())
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _save(folder: Path, module: nn.Module, meta: dict[str, Any]) -> None:
    save_tensors_atomic(folder / "weights.safetensors", module.state_dict())
    write_json_atomic(folder / "backbone.json", meta)


def _load(folder: Path, recipe: BackboneRecipe, train_idx: torch.Tensor, eval_idx: torch.Tensor) -> PretrainedBackbone:
    meta = read_json(folder / "backbone.json")
    if json.loads(json.dumps(dataclasses.asdict(recipe))) != meta["recipe"]:
        raise KeyError("recipe")  # a key collision or a hand-edited entry: pretrain again
    module = recipe.build()
    module.load_state_dict(load_tensors(folder / "weights.safetensors"), strict=True)
    module.eval()
    return PretrainedBackbone(recipe.name, module, recipe, float(meta["held_out_accuracy"]), float(meta["pretrain_seconds"]),
                              train_idx, eval_idx, True, list(meta.get("history", [])))


# ------------------------------------------------------------------------------------------- as embedded models


def load_tiny_vit_fmnist() -> tuple[nn.Module, None]:
    """The embedded model "tiny-vit-fmnist-0to4": (TinyViT pretrained on Fashion-MNIST classes 0-4, no tokenizer)."""
    return pretrained_backbone("tiny-vit-fmnist-0to4").module, None


def load_resnet_small_fmnist() -> tuple[nn.Module, None]:
    """The embedded model "resnet-small-fmnist": (SmallResNet pretrained on all 10 classes at 14x14, no tokenizer)."""
    return pretrained_backbone("resnet-small-fmnist").module, None


def stand_in(architecture: str, seed: int = 0, **shape: Any) -> tuple[nn.Module, None]:
    """A smoke run's stand-in for a pretrained backbone: the same architecture, randomly initialised (seeded)."""
    recipe = RECIPES[{"tiny-vit": "tiny-vit-fmnist-0to4", "resnet-small": "resnet-small-fmnist"}[architecture]]
    kwargs = {**recipe.model, **shape}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = ARCHITECTURES[architecture](num_classes=len(recipe.classes), **kwargs)
    return describe_backbone(module, architecture, len(recipe.classes), kwargs, recipe.image_size), None


# ------------------------------------------------------------------------------------------- as a model folder

FOLDER_FORMAT = "vision-backbone"  # config.json's rankwise_format (registry/general.py names the loader)


def describe_backbone(module: nn.Module, architecture: str, num_classes: int, kwargs: dict[str, Any],
                      image_size: int) -> nn.Module:
    """Attach what rebuilds the module (`backbone_spec`) and the image side it reads (`image_size`)."""
    module.backbone_spec = {"architecture": architecture, "num_classes": num_classes, "kwargs": dict(kwargs)}
    module.image_size = image_size
    return module


def save_backbone(module: nn.Module, folder: str | Path) -> None:
    """Write a backbone built here as a model folder (config.json + model.safetensors) into `folder` (a temporary
    folder of `core.io.save_model_folder`); `load_backbone_folder` reads it back."""
    spec = getattr(module, "backbone_spec", None)
    if spec is None:
        raise InvalidInputError(f"{type(module).__name__} was not built by rankwise.models.vision: no backbone_spec to save")
    folder = Path(folder)
    save_tensors_atomic(folder / "model.safetensors", module.state_dict())
    write_json_atomic(folder / "config.json", {"model_type": spec["architecture"], "rankwise_format": FOLDER_FORMAT,
                                               "rankwise_inputs": "images", "image_size": module.image_size, **spec})


def load_backbone_folder(path: str | Path) -> tuple[nn.Module, None]:
    """(module, None) from a folder `save_backbone` wrote; its manifest is verified first."""
    from rankwise.core.io import verify_manifest

    path = Path(path)
    verify_manifest(path)
    config = read_json(path / "config.json")
    try:
        architecture, num_classes, kwargs = config["architecture"], int(config["num_classes"]), dict(config["kwargs"])
        cls = ARCHITECTURES[architecture]
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptFileError(f"{path / 'config.json'} is not a vision-backbone config ({e!r})") from e
    module = cls(num_classes=num_classes, **kwargs)
    module.load_state_dict(load_tensors(path / "model.safetensors"), strict=True)
    return describe_backbone(module.eval(), architecture, num_classes, kwargs, int(config["image_size"])), None


def tiny_vit_stand_in(seed: int = 0, **shape: Any) -> tuple[nn.Module, None]:
    return stand_in("tiny-vit", seed, **shape)


def resnet_small_stand_in(seed: int = 0, **shape: Any) -> tuple[nn.Module, None]:
    return stand_in("resnet-small", seed, **shape)
