"""rankwise: low-rank structure and efficient adaptation, 38 ICLR 2026 methods on real models."""

from rankwise.errors import RankwiseError

__version__ = "0.1.0"
__all__ = ["RankwiseError", "__version__"]
