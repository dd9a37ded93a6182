"""A concept bottleneck model with Magnet attention and the IVQ regulariser (Gao et al., ICLR 2026), and the
baselines it is compared with, on any backbone with `tokens(x)`:

    groups = ConceptGroups(names, values, embeddings)            # text embeddings per group, [n_k, E] each
    model = ConceptBottleneckModel(backbone, groups, num_classes, CBMConfig(regulariser="ivq"))
    result = fit_cbm(model, LabelledConcepts(x, y, c), LabelledConcepts(xv, yv, cv))
    evaluate_cbm(result.model, test), result.rank_curve         # metrics in points; effective rank per epoch

The layers are `rankwise.nn.ivq`."""

from rankwise.apps.vision.cbm.concepts import ConceptGroups
from rankwise.apps.vision.cbm.config import HEADS, POOLINGS, REGULARISERS, CBMConfig
from rankwise.apps.vision.cbm.metrics import LabelledConcepts, balanced_accuracy, evaluate_cbm
from rankwise.apps.vision.cbm.model import CBMOutput, ConceptBottleneckModel, check_images
from rankwise.apps.vision.cbm.train import CBMResult, CBMTask, RankProbe, fit_cbm

__all__ = ["ConceptGroups", "CBMConfig", "POOLINGS", "REGULARISERS", "HEADS", "LabelledConcepts", "balanced_accuracy",
           "evaluate_cbm", "CBMOutput", "ConceptBottleneckModel", "check_images", "CBMResult", "CBMTask", "RankProbe",
           "fit_cbm"]
