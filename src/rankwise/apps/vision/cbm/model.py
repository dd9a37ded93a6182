"""The concept bottleneck model: backbone -> patch tokens Z_p -> (IVQ | explicit VQ | ...) -> Magnet prototypes ->
per-group concept scores against text embeddings -> class head (IVQ-CBM's `ivq_cbm.py`, sizes made config).

    x [B, C, H, W] --backbone.tokens--> [B, 1 + L, D] --drop CLS--> Z_p [B, L, D]
    Z_p --regulariser--> (tokens, loss)           IVQ: tokens = Z_p; explicit VQ: tokens = Z_q (straight through)
    tokens --Magnet--> prototypes [B, K, D] --FFN(D->4D->D, ReLU), LayerNorm, Linear(D->E, no bias), L2--> m_k
    v_k = scale * <m_k, tau_{k, c}> for the values c of group k  -> concatenated [B, V] -> Linear(V -> classes)

CLS pooling (the baselines) reads the CLS token instead: head "linear" is a Linear(D -> V) concept layer (CLS +
linear head); head "text" projects it (Linear D -> E, L2) and scores it against every group's texts (the linear
label-free CBM, trained without concept labels).

The backbone is any module with `tokens(x) -> [B, 1 + L, D]` (CLS first), e.g. `rankwise.models.vision.TinyViT`;
its `in_channels` and `image_size`, where present, are checked against the images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.apps.vision.cbm.concepts import ConceptGroups
from rankwise.apps.vision.cbm.config import CBMConfig
from rankwise.errors import InvalidInputError
from rankwise.nn.ivq import ExplicitVQ, ImplicitVQ, MagnetAttention, barlow_loss, spectral_loss


@dataclass
class CBMOutput:
    """logits [B, classes]; concept_scores [B, V] (groups concatenated in order); patches Z_p [B, L, D] (before any
    quantisation); reg_loss the regulariser's scalar (0 without one); assignments [B, L, K] (Magnet) or None."""

    logits: torch.Tensor
    concept_scores: torch.Tensor
    patches: torch.Tensor
    reg_loss: torch.Tensor
    assignments: torch.Tensor | None


def check_images(x: torch.Tensor, backbone: nn.Module) -> None:
    """Refuse images that are not float [B, C, H, W] in [0, 1] of the backbone's channels and size."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        raise InvalidInputError(f"images must be a float tensor [B, C, H, W], got "
                                f"{getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
    c, size = getattr(backbone, "in_channels", None), getattr(backbone, "image_size", None)
    if (c is not None and x.shape[1] != c) or (size is not None and tuple(x.shape[2:]) != (size, size)):
        raise InvalidInputError(f"the backbone reads [B, {c}, {size}, {size}] images, got {tuple(x.shape)} (resize them)")
    if x.device.type != "meta" and x.numel() and (not bool(torch.isfinite(x).all()) or float(x.min()) < 0 or float(x.max()) > 1):
        raise InvalidInputError("images must be finite with values in [0, 1] (divide 8-bit images by 255)")


class ConceptBottleneckModel(nn.Module):
    """See the module docstring. `forward(x) -> logits`; `outputs(x) -> CBMOutput` (everything the losses read)."""

    def __init__(self, backbone: nn.Module, groups: ConceptGroups, num_classes: int, config: CBMConfig | None = None,
                 width: int | None = None, num_queries: int | None = None) -> None:
        super().__init__()
        config = config or CBMConfig()
        config.validate()
        if not callable(getattr(backbone, "tokens", None)):
            raise InvalidInputError(f"the backbone ({type(backbone).__name__}) needs tokens(x) -> [B, 1 + L, D] (CLS first)")
        if num_classes < 2:
            raise InvalidInputError(f"num_classes must be >= 2, got {num_classes}")
        k = groups.num_groups
        if num_queries is not None and num_queries != k:
            raise InvalidInputError(f"{num_queries} Magnet queries but {k} concept groups with text embeddings: the "
                                    "prototype of query k is scored against group k's texts, so they must match")
        d = width or getattr(backbone, "width", None)
        if not d:
            raise InvalidInputError("pass width= (the backbone's token width D): the backbone has no `width`")
        self.backbone, self.groups, self.config, self.width = backbone, groups, config, int(d)
        self.sizes = list(groups.sizes)
        text = torch.cat([F.normalize(e.detach().float(), dim=-1) for e in groups.embeddings])  # [V, E]
        self.register_buffer("text", text, persistent=False)
        self.register_buffer("group_of", torch.repeat_interleave(torch.arange(k), torch.tensor(self.sizes)),
                             persistent=False)
        m = config.num_codes or k
        self.quantizer: nn.Module | None = None
        if config.regulariser == "ivq":
            self.quantizer = ImplicitVQ(m, d, config.beta, config.frozen_codebook)
        elif config.regulariser == "explicit-vq":
            self.quantizer = ExplicitVQ(m, d, config.beta, config.frozen_codebook)
        e = groups.text_dim
        self.magnet = MagnetAttention(k, d, config.temperature) if config.pooling == "magnet" else None
        if config.pooling == "magnet":
            self.bridge = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d), nn.LayerNorm(d),
                                        nn.Linear(d, e, bias=False))
        elif config.head == "text":
            self.bridge = nn.Linear(d, e, bias=False)
        else:
            self.bridge = nn.Linear(d, groups.num_values)
        self.log_scale = nn.Parameter(torch.tensor(math.log(config.logit_scale)))
        self.classifier = nn.Linear(groups.num_values, num_classes)
        if config.freeze_backbone:
            for p in self.backbone.parameters():
                p.requires_grad_(False)

    def backbone_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.backbone.parameters() if p.requires_grad]

    def outputs(self, x: torch.Tensor) -> CBMOutput:
        check_images(x, self.backbone)
        tokens = self.backbone.tokens(x)
        if tokens.dim() != 3 or tokens.shape[-1] != self.width or tokens.shape[1] < 2:
            raise InvalidInputError(f"backbone.tokens gave {tuple(tokens.shape)}, expected [B, 1 + L, {self.width}]")
        cls, z = tokens[:, 0], tokens[:, 1:]  # CLS [B, D], Z_p [B, L, D]
        reg = z.new_zeros(())
        forward_tokens = z
        if self.quantizer is not None:
            q = self.quantizer(z)
            forward_tokens, reg = q.tokens, q.loss
        elif self.config.regulariser == "spectral":
            reg = spectral_loss(z)
        elif self.config.regulariser == "barlow":
            reg = barlow_loss(z)
        scale = self.log_scale.exp()
        assignments = None
        if self.magnet is not None:
            protos, assignments = self.magnet(forward_tokens)  # [B, K, D]
            m = F.normalize(self.bridge(protos), dim=-1)  # [B, K, E]
            sims = m @ self.text.T  # [B, K, V]: every prototype against every text
            # prototype k scores only the values of its own group k
            scores = scale * sims.gather(1, self.group_of.view(1, 1, -1).expand(sims.shape[0], 1, -1)).squeeze(1)
        elif self.config.head == "text":
            scores = scale * F.normalize(self.bridge(cls), dim=-1) @ self.text.T
        else:
            scores = self.bridge(cls)
        return CBMOutput(self.classifier(scores), scores, z, reg, assignments)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outputs(x).logits

    def group_scores(self, scores: torch.Tensor) -> list[torch.Tensor]:
        """Split concept scores [B, V] into the K groups' [B, n_k]."""
        return list(torch.split(scores, self.sizes, dim=1))
