"""rankwise: low-rank structure and efficient adaptation, 38 ICLR 2026 methods on real models."""

import logging

from rankwise.errors import RankwiseError

# transformers imports torchao when it is installed; on a CPU machine torchao logs that its GPU kernels cannot load
# and torch warns about its enum registrations. Both are harmless here and would bury our own output.
logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

__version__ = "0.1.0"
__all__ = ["RankwiseError", "__version__"]
