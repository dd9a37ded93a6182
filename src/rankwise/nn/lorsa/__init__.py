"""Lorsa (low-rank sparse attention): a sparse replacement of an attention layer by many rank-1 OV heads.

    lorsa = Lorsa(LorsaConfig(d_model=576, n_qk=18, n_ov=1152, d_qk=64, k=32, rope=Rope(64, 1e5)))
    fit(lorsa, x, y, FitConfig(steps=1000, lr=2e-3))     # x: attention input [N, T, d], y: its output [N, T, d]
    fvu(lorsa, x_val, y_val)                              # fraction of variance unexplained
    top_activating_contexts(lorsa, x_val, head=12)        # where a head fires

`lorsa_from_attention` writes an attention layer exactly as a Lorsa (K = all heads); `TopKSAE` is the baseline.
"""

from rankwise.nn.lorsa.config import LorsaConfig
from rankwise.nn.lorsa.fit import FitConfig, FitResult, fit, fvu, set_scales_
from rankwise.nn.lorsa.interpret import (
    TopContext,
    induction_score,
    mechanism_fractions,
    previous_occurrence,
    purity,
    top_activating_contexts,
)
from rankwise.nn.lorsa.io import load_lorsa, save_lorsa
from rankwise.nn.lorsa.layer import Lorsa
from rankwise.nn.lorsa.mha import CausalSelfAttention, lorsa_from_attention, lorsa_from_mha
from rankwise.nn.lorsa.rope import Rope
from rankwise.nn.lorsa.sae import TopKSAE

__all__ = [
    "Lorsa", "LorsaConfig", "Rope", "CausalSelfAttention", "lorsa_from_attention", "lorsa_from_mha", "TopKSAE",
    "FitConfig", "FitResult", "fit", "fvu", "set_scales_", "TopContext", "top_activating_contexts",
    "induction_score", "mechanism_fractions", "previous_occurrence", "purity", "load_lorsa", "save_lorsa",
]
