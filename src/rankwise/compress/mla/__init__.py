"""CARE: covariance-aware GQA/MHA -> multi-head latent attention conversion (one-shot), with its baselines.

    from rankwise.compress.mla import convert_to_mla, calibration_windows, save_mla
    windows = calibration_windows(token_windows(tokenizer, "calibration", 32))   # 256 x 32 tokens, seeded
    mla = convert_to_mla(model, kv_rank=48, method="care", allocation="adjusted", calibration=windows)
    save_mla(mla, "out/", tokenizer)                                 # load_model("out/") reloads it
    own = text_calibration_windows(tokenizer, open("my_domain.txt").read())   # calibrate on the serving domain

Files: modules (LowRankLinear), layout (supported models, cache accounting), calibration, factorize (svd, asvd,
svd-llm, mha2mla, care), allocation (uniform / water-filling), convert (the pipeline), metrics (activation
error), parity (GQA = MLA at full rank), io (save / load).
"""

from rankwise.compress.mla.allocation import ALLOCATIONS, SCORES, allocate_ranks
from rankwise.compress.mla.calibration import calibration_windows, kv_input_moments, text_calibration_windows
from rankwise.compress.mla.convert import KVDecomposition, MLAPlan, apply_plan, convert_to_mla, decompose_kv
from rankwise.compress.mla.factorize import METHODS
from rankwise.compress.mla.io import load_mla, read_mla_record, save_mla
from rankwise.compress.mla.layout import FORMAT, kv_layout, kv_saving, latent_kv_elements_per_token, mla_info
from rankwise.compress.mla.metrics import LayerError, activation_errors
from rankwise.compress.mla.modules import LowRankLinear
from rankwise.compress.mla.parity import head_replication_matrix, kv_parity_factors

__all__ = [
    "convert_to_mla", "decompose_kv", "apply_plan", "KVDecomposition", "MLAPlan", "allocate_ranks", "ALLOCATIONS",
    "SCORES", "METHODS", "calibration_windows", "text_calibration_windows", "kv_input_moments", "save_mla", "load_mla", "read_mla_record", "FORMAT",
    "kv_layout", "kv_saving", "latent_kv_elements_per_token", "mla_info", "activation_errors", "LayerError",
    "LowRankLinear", "head_replication_matrix", "kv_parity_factors",
]
