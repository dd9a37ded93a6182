"""Escape directions of deep bias-free ReLU nets from the origin saddle, and their low-rank structure.

    from rankwise.algorithms.escape_directions import (
        optimal_escape_direction, mse_gradient_at_zero, layer_ratios, depth_gap)
    g = mse_gradient_at_zero(y_star)                       # y_star [d_L, N], X [d_0, N]: columns are samples
    rho = optimal_escape_direction(x, g, [64, 64, 64, 64, 64, 64, 10], steps=1500, restarts=3)
    depth_gap(layer_ratios(rho.weights))                   # min over deeper layers of (s1/s2)(W_l) / l^(1/4)
"""

from rankwise.algorithms.escape_directions.dynamics import RULES, Trajectory, balance, train_from_init
from rankwise.algorithms.escape_directions.escape import (
    EscapeDirection, escape_speed, fixed_point_alignment, local_loss_gradient, norm_growth, optimal_escape_direction,
    to_sphere,
)
from rankwise.algorithms.escape_directions.network import (
    backprop, forward, init_weights, layer_widths, local_loss, mse_gradient_at_zero, mse_loss, output, parameter_norm,
)
from rankwise.algorithms.escape_directions.spectra import (
    activation_shares, deep_layers, depth_gap, layer_ratios, layer_shares, rank_one_share, relu_gap, sigma_ratio,
    singular_values,
)
from rankwise.algorithms.escape_directions.toy import RANK_ONE_SPEED, toy_data, toy_rank_two_escape

__all__ = [
    "RANK_ONE_SPEED", "RULES", "EscapeDirection", "Trajectory", "activation_shares", "balance", "deep_layers",
    "depth_gap", "backprop", "escape_speed", "fixed_point_alignment", "forward", "init_weights", "layer_ratios", "layer_shares",
    "layer_widths", "local_loss", "local_loss_gradient", "mse_gradient_at_zero", "mse_loss", "norm_growth",
    "optimal_escape_direction", "output", "parameter_norm", "rank_one_share", "relu_gap", "sigma_ratio",
    "singular_values", "to_sphere", "toy_data", "toy_rank_two_escape", "train_from_init",
]
