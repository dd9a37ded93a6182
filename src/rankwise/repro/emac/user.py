"""`rankwise run emac-autta:adapt`: EMAC (or a baseline arm) on your own image stream.

    rankwise run emac-autta images=stream.safetensors model=MODEL_DIR budget=0.03 --out DIR

`images`: a safetensors file with "images" float32 [N, C, H, W] in [0, 1] (in stream order) and "labels" int64 [N]
(the simulated oracle: the known class 0..C-1, or -1 for a new class; needed when budget > 0, and for the scores);
`model`: a model folder `rankwise.models.load_model` reads (a vision backbone with a final linear head, D > C), or
"" for this reproduction's source model (SmallResNet pretrained on Fashion-MNIST classes 0-5, 14x14 input). DIR
receives predictions.safetensors (online predictions, -1 = unknown; regions 0 old / 1 mix / 2 new; annotated) and
the adapted weights (adapted.safetensors); result.json holds the scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from rankwise.apps.vision.emac import LOSSES, PARAMS, SELECTORS, EmacConfig, adapt_stream
from rankwise.core.options import option
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class UserStreamConfig:
    images: str = field(metadata=option(metavar="FILE.safetensors", help="images [N,C,H,W] in [0,1] and labels [N] (-1 = unknown)"))
    model: str = ""  # a model folder; "" = the reproduction's Fashion-MNIST source model
    budget: float = 0.03
    lr: float = 1e-3
    loss: str = field(default="emac", metadata=option(choices=LOSSES))
    selector: str = field(default="emac", metadata=option(choices=SELECTORS))
    restrict_to_mix: bool = True
    params: str = field(default="bn", metadata=option(choices=PARAMS))
    batch_size: int = 32
    seed: int = 0

    def emac(self) -> EmacConfig:
        return EmacConfig(budget=self.budget, lr=self.lr, loss=self.loss, selector=self.selector,
                          restrict_to_mix=self.restrict_to_mix, params=self.params, batch_size=self.batch_size, seed=self.seed)

    def validate(self) -> None:
        self.emac().validate()
        if not Path(self.images).is_file():
            raise InvalidInputError(f"images={self.images!r} is not a file: pass a safetensors file with 'images' (and 'labels')")


def run_on_files(config: UserStreamConfig, out: Path) -> dict:
    """Load the stream and the model, adapt online, write the predictions and adapted weights; return the scores."""
    from rankwise.core.io import load_tensors, save_tensors_atomic

    config.validate()
    tensors = load_tensors(config.images)
    if "images" not in tensors:
        raise InvalidInputError(f"{config.images} holds {sorted(tensors)}; it needs 'images' [N, C, H, W] (and 'labels' [N])")
    images = tensors["images"].float()
    labels = tensors.get("labels")
    if labels is None:
        if config.budget > 0:
            raise InvalidInputError("budget > 0 needs the oracle's 'labels' in the images file (or pass budget=0)")
        labels = torch.zeros(images.shape[0], dtype=torch.int64)  # never read at budget 0; scores are then meaningless
    if config.model:
        from rankwise.models import load_model

        model = load_model(config.model)[0]
    else:
        from rankwise.repro.emac.data import source_model

        model = source_model(True, config.seed)[0]
    result = adapt_stream(model, images, labels.long(), config.emac())
    out.mkdir(parents=True, exist_ok=True)
    save_tensors_atomic(out / "predictions.safetensors", {"predictions": result.predictions, "regions": result.regions,
                                                          "annotated": result.annotated.to(torch.uint8)})
    save_tensors_atomic(out / "adapted.safetensors", result.model.state_dict())
    summary = result.to_dict()
    summary["scored"] = "labels" in tensors
    return summary
