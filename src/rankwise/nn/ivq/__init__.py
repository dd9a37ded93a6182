"""IVQ + Magnet attention (Gao et al., ICLR 2026, "Escaping Low-Rank Traps"): the implicit vector-quantisation
regulariser of patch tokens, the explicit VQ it is compared with, Magnet attention's concept prototypes, diversity
regularisers (spectral, Barlow-style) and the effective-rank diagnostic of patch features. The concept bottleneck
model built from them is `rankwise.apps.vision.cbm`."""

from rankwise.nn.ivq.magnet import MagnetAttention
from rankwise.nn.ivq.quantizer import ExplicitVQ, ImplicitVQ, QuantizerOutput, nearest_codes, vq_loss_terms
from rankwise.nn.ivq.rank import RankReading, cumulative_rank, patch_rank
from rankwise.nn.ivq.regularisers import barlow_loss, spectral_loss

__all__ = ["ImplicitVQ", "ExplicitVQ", "QuantizerOutput", "nearest_codes", "vq_loss_terms", "MagnetAttention",
           "RankReading", "cumulative_rank", "patch_rank", "spectral_loss", "barlow_loss"]
