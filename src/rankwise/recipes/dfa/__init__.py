"""Direct feedback alignment with feedback-weight matching (card dfa-feedback-matching.md).

  matching.py    feedback matching (F̄ by top-down least squares) and weight matching (W̄_l = F̄_l F̄_{l-1}ᵀ)
  autograd.py    the custom autograd functions: `loss.backward()` is the DFA step
  layers.py      DFALinear / DFAOutputLinear (the swapped-in layers) and their shared FeedbackHub
  sites.py       which linears of a model DFA trains, the fused activations, the chain for matching
  alignment.py   weight alignment and gradient alignment (cosines)
  procedure.py   DfaConfig, DfaProcedure, build: `rankwise finetune --method full --procedure dfa`
"""

from rankwise.recipes.dfa.alignment import cosine, gradient_alignment, weight_alignment
from rankwise.recipes.dfa.layers import DFALinear, DFAOutputLinear, FeedbackHub
from rankwise.recipes.dfa.matching import feedback_matching, projection_form, random_feedback, weight_matching
from rankwise.recipes.dfa.procedure import DfaConfig, DfaProcedure, build

__all__ = ["cosine", "gradient_alignment", "weight_alignment", "DFALinear", "DFAOutputLinear", "FeedbackHub",
           "feedback_matching", "projection_form", "random_feedback", "weight_matching", "DfaConfig", "DfaProcedure",
           "build"]
