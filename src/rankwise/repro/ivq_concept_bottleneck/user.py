"""`rankwise run ivq-concept-bottleneck:fit`: an IVQ + Magnet concept bottleneck trained on your own labelled images.

    rankwise run ivq-concept-bottleneck data=train.safetensors groups=groups.json --out DIR

`data`: a safetensors file with "images" float32 [N, 3, 32, 32] in [0, 1], "classes" int64 [N] and "concepts" int64
[N, K] (for each image, the index of its value in each of the K concept groups). `groups`: a JSON object from each
group's name to its list of values, in the order of the concept columns, e.g. {"shape": ["circle", "square"], ...};
each value is embedded by MiniLM as "an object whose {group} is {value}". The backbone is this reproduction's
TinyViT (d 64, 8x8 patches of 32x32 images), pretrained here on procedural attribute images and fine-tuned inside
the CBM (lr x 0.1). A held-out `val_fraction` of the images gives the metrics and the rank curve. DIR receives the
trained model's tensors (cbm.safetensors); result.json holds the validation metrics and the patch-feature rank per
epoch. With your own backbone (any module with `tokens(x) -> [B, 1 + L, D]`), use `rankwise.apps.vision.cbm` from
Python.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rankwise.apps.vision.cbm import CBMConfig, ConceptBottleneckModel, ConceptGroups, LabelledConcepts, fit_cbm
from rankwise.apps.vision.cbm.config import REGULARISERS
from rankwise.core.options import option
from rankwise.errors import InvalidInputError

IMAGE_SHAPE = (3, 32, 32)
PROMPT = "an object whose {group} is {value}"


@dataclass(frozen=True)
class FitConfig:
    data: str = field(metadata=option(metavar="FILE.safetensors", help="'images' [N,3,32,32], 'classes' [N], 'concepts' [N,K]"))
    groups: str = field(metadata=option(metavar="FILE.json", help='{"group": ["value", ...], ...} in concept-column order'))
    regulariser: str = field(default="ivq", metadata=option(choices=REGULARISERS))
    epochs: int = 10
    lr: float = 3e-3
    temperature: float = 16.0  # the reproduction's Magnet temperature (1 gives near one-hot assignments at d 64)
    val_fraction: float = 0.2
    seed: int = 0
    pretrained: bool = True  # False: a tiny random TinyViT of the same shape (a check of the path, not a model)

    def validate(self) -> None:
        for name in ("data", "groups"):
            if not Path(getattr(self, name)).is_file():
                raise InvalidInputError(f"{name}={getattr(self, name)!r} is not a file")
        if not 0 < self.val_fraction < 1:
            raise InvalidInputError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        CBMConfig(regulariser=self.regulariser, epochs=self.epochs, lr=self.lr, temperature=self.temperature,
                  seed=self.seed).validate()


def _groups_file(path: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"groups={path}: not a JSON file ({e})") from None
    if not isinstance(raw, dict) or not raw:
        raise InvalidInputError(f"groups={path}: need a JSON object {{group: [values]}} with at least one group")
    for name, values in raw.items():
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise InvalidInputError(f"groups={path}: group {name!r} needs a non-empty list of value names")
    return tuple(raw), tuple(tuple(v) for v in raw.values())


def _data(path: str, k: int) -> LabelledConcepts:
    from rankwise.core.io import load_tensors

    t = load_tensors(path)
    missing = {"images", "classes", "concepts"} - set(t)
    if missing:
        raise InvalidInputError(f"data={path} lacks {sorted(missing)}")
    images = t["images"].float()
    if images.dim() != 4 or tuple(images.shape[1:]) != IMAGE_SHAPE:
        raise InvalidInputError(f"data={path}: images must be [N, 3, 32, 32], got {tuple(images.shape)}")
    if float(images.min()) < 0 or float(images.max()) > 1:
        raise InvalidInputError(f"data={path}: images must lie in [0, 1] (divide uint8 pixels by 255)")
    concepts = t["concepts"].long()
    if concepts.dim() != 2 or concepts.shape[1] != k:
        raise InvalidInputError(f"data={path}: concepts must be [N, {k}] (one column per group), got {tuple(concepts.shape)}")
    return LabelledConcepts(images, t["classes"].long(), concepts)


def run_on_files(config: FitConfig, out: Path) -> dict:
    """Check the files, embed the concept texts, split off validation, train the CBM, write its tensors."""
    from rankwise.core.io import save_tensors_atomic
    from rankwise.models import embed_sentences, load_model
    from rankwise.repro.ivq_concept_bottleneck.main import SIZES, proxy_backbone

    config.validate()
    names, values = _groups_file(config.groups)
    data = _data(config.data, len(names))
    n = len(data)
    n_val = max(1, int(round(config.val_fraction * n)))
    if n - n_val < 2:
        raise InvalidInputError(f"data={config.data}: {n} images leave too few for training after validation")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(config.seed))
    take = lambda idx: LabelledConcepts(data.images[idx], data.classes[idx], data.concepts[idx])  # noqa: E731
    val, train = take(order[:n_val]), take(order[n_val:])
    text_model, tokenizer = load_model("minilm-l6")
    texts = [PROMPT.format(group=g, value=v) for g, vals in zip(names, values) for v in vals]
    with torch.no_grad():
        emb = embed_sentences(text_model, tokenizer, texts)
    groups = ConceptGroups(names, values, tuple(torch.split(emb, [len(v) for v in values])))
    for what, part in (("training data", train), ("validation data", val)):
        part.check(groups, what)
    size = "full" if config.pretrained else "smoke"
    backbone = proxy_backbone(SIZES[size], size, 0).module
    num_classes = int(data.classes.max()) + 1
    cbm_config = CBMConfig(regulariser=config.regulariser, epochs=config.epochs, lr=config.lr,
                           temperature=config.temperature, seed=config.seed, rank_probe=min(128, n_val))
    result = fit_cbm(ConceptBottleneckModel(backbone, groups, max(2, num_classes), cbm_config), train, val)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors_atomic(out / "cbm.safetensors", {k: v.detach().contiguous() for k, v in result.model.state_dict().items()})
    return {"train_images": len(train), "val_images": len(val), "groups": dict(zip(names, values)),
            "val": result.val, "rank_curve": result.rank_curve, "steps": result.steps}
