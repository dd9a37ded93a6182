"""TraDy (card trady.md): a-priori layer ranking by reweighted gradient norm on a proxy task, then per-epoch uniform
resampling of input channels within a joint weight + activation memory budget; only the drawn channels' weight
slices train and only their activation slices are kept for the backward.

  costs.py          Θ_space,c = C^W_c + C^A_c, layer geometry (from one forward), Algorithm 1's budget fill
  sparse_layers.py  ChannelSparse: the custom autograd conv/linear that saves x[:, selected] and returns dW[:, selected]
  selection.py      the unit pool and the rules: uniform draw, top score (Det RGN / Velocity)
  rgn.py            RGN scores, rank_layers (stage 1 on a proxy task), LayerRanking (save/load, top-K at 97%)
  velocity.py       Velocity / NEq neuron velocities (the paper's neuron-level baseline)
  norms.py          batch-norm statistics frozen
  optimizer.py      sgd(): the paper's SGD without momentum, for the training loop
  procedure.py      TradyConfig, TradyProcedure, build: `rankwise finetune --method full --procedure trady`
"""

from rankwise.recipes.trady.costs import LayerGeometry, fill_budget, find_layers, full_cost, measure_geometry
from rankwise.recipes.trady.optimizer import sgd
from rankwise.recipes.trady.procedure import TradyConfig, TradyProcedure, build
from rankwise.recipes.trady.rgn import LayerRanking, channel_rgn, layer_score, load_ranking, rank_layers, spearman
from rankwise.recipes.trady.selection import UnitPool, random_selection, top_score_selection
from rankwise.recipes.trady.sparse_layers import ChannelSparse
from rankwise.recipes.trady.velocity import VelocityTracker

__all__ = ["ChannelSparse", "LayerGeometry", "LayerRanking", "TradyConfig", "TradyProcedure", "UnitPool",
           "VelocityTracker", "build", "channel_rgn", "fill_budget", "find_layers", "full_cost", "layer_score",
           "load_ranking", "measure_geometry", "random_selection", "rank_layers", "sgd", "spearman", "top_score_selection"]
