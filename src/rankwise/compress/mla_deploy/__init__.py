"""Deployable MLA: a GQA model turned into multi-head latent attention whose KV cache holds only the latent.

    from rankwise.compress.mla_deploy import convert_to_deployable_mla, export_deepseek_v3, mla_parameters
    from rankwise.training.healing import HealConfig, heal
    mla = convert_to_deployable_mla(model, kv_rank=80, rope_dims=32, rope_selection="high", calibration=windows)
    mla.generate(ids)                                    # DynamicCache holding latent + shared rope key only
    heal(mla, model, train_windows, HealConfig(steps=40), checkpoint_dir="ckpt", trainable=mla_parameters)
    export_deepseek_v3(mla, "out/", tokenizer)            # AutoModelForCausalLM.from_pretrained("out/") loads it

Files: rope (decoupled RoPE: RoRoPE concentration, pair selections), attention (MLAAttention, absorbed and
expanded decoding), build (conversion from a Llama GQA model, reusing CARE's calibration, whitened SVD and rank
allocation from `compress.mla`), export (stock DeepSeek-V3 checkpoint),
checks (decoding agreement, generation, decode speed), cli (`convert mla --deploy`). Healing (the recovery fine-tune,
distilled from the original) is a training recipe: `rankwise.training.healing`; the reproduction is
`rankwise.repro.care_mla.deploy`.
"""

from rankwise.compress.mla_deploy.attention import MLAAttention
from rankwise.compress.mla_deploy.build import (
    NEW_PARAMETERS, convert_to_deployable_mla, deploy_info, expected_cache_bytes_per_token, mla_layers, mla_parameters, set_absorb,
)
from rankwise.compress.mla_deploy.export import deepseek_v3_config, export_deepseek_v3, load_deepseek_v3, to_deepseek_v3
from rankwise.compress.mla_deploy.rope import SELECTIONS

__all__ = [
    "MLAAttention", "convert_to_deployable_mla", "deploy_info", "expected_cache_bytes_per_token", "mla_layers", "mla_parameters",
    "NEW_PARAMETERS", "set_absorb",
    "deepseek_v3_config", "export_deepseek_v3", "load_deepseek_v3", "to_deepseek_v3",
    "SELECTIONS",
]
