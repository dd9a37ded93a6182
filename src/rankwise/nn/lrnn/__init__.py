"""LRNN: deep low-rank separated networks, neurons that are products of learnable univariate components.

`LRNN` (the network), `LowRankSeparatedLayer` (one product layer), `UnivariateComponents` (the grouped scalar MLPs),
`Siren` (the INR baseline), `radon_transform` (a differentiable parallel-beam projector for CT), parameter counts.
"""

from rankwise.nn.lrnn.activations import ACTIVATIONS, get_activation
from rankwise.nn.lrnn.components import UnivariateComponents, component_parameter_count
from rankwise.nn.lrnn.layer import LowRankSeparatedLayer, layer_parameter_count
from rankwise.nn.lrnn.network import LRNN, lrnn_parameter_count
from rankwise.nn.lrnn.radon import circle_mask, radon_transform, rotation_grid
from rankwise.nn.lrnn.siren import Siren, siren_parameter_count

__all__ = ["ACTIVATIONS", "get_activation", "UnivariateComponents", "component_parameter_count",
           "LowRankSeparatedLayer", "layer_parameter_count", "LRNN", "lrnn_parameter_count", "Siren",
           "siren_parameter_count", "radon_transform", "rotation_grid", "circle_mask"]
