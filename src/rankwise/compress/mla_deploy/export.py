"""Export a deployable MLA model as a stock `transformers` DeepSeek-V3 checkpoint (dense MLPs, no MoE, no MTP).

DeepSeek-V3's attention differs from ours in four places; each is mapped exactly or as near as floats allow:
  * **one joint latent** for K and V (`kv_lora_rank`), up-projected per *query* head by `kv_b_proj`: we use the
    split form [c_K, c_V] with a block-diagonal `kv_b_proj` (each head's k_nope rows read c_K, its v rows c_V; the
    KV-group blocks are repeated over the group's query heads); a joint latent maps as it is. Exact. Layers with
    different latent widths (adjusted allocation) are zero-padded to the widest, which the exported cache then
    stores too.
  * **`kv_a_layernorm`**, an RMSNorm (eps fixed at 1e-6 in transformers) on the latent. It cannot be switched off,
    but RMSNorm(s z) = w s z / sqrt(s^2 ms(z) + eps) is linear once s^2 ms(z) << eps. We scale the latent rows of
    `kv_a_proj_with_mqa` by a tiny s and set the norm weight to sqrt(eps) / s, so the norm multiplies by
    1 / sqrt(1 + s^2 ms(z) / eps). s is chosen from a hard bound on ms(z) (the norm's input has ||x||^2 = D max
    gain^2 at most), so the deviation is below `linearity` / 2 for *every* token. Near exact; needs fp32 or bf16
    (fp16 would underflow the scaled latent).
  * **softmax scale** 1/sqrt(qk_nope + qk_rope) instead of our 1/sqrt(dh): folded into `q_proj`. Exact.
  * **rotary frequencies**: DeepSeek-V3 has one rotary embedding of width qk_rope_head_dim; our kept pairs are an
    arbitrary subset of the original frequencies. LongRoPE's per-pair `short_factor` (= `long_factor`, attention
    factor 1) reproduces any subset; only the float32 rounding of the frequencies differs.
`rope_interleave=False` keeps the `rotate_half` layout. The gap that remains is measured and reported.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerBase

from rankwise.compress.mla.layout import decoder_layers
from rankwise.compress.mla_deploy.build import deploy_info, mla_layers
from rankwise.core.io import MANIFEST_NAME, save_model_folder, verify_manifest
from rankwise.errors import CorruptFileError, InvalidInputError

FORMAT = "mla-deploy"  # the manifest's rankwise_format (config.json has none: stock transformers loads the folder)
NORM_EPS = 1e-6  # DeepseekV3Attention builds kv_a_layernorm with the RMSNorm default eps, not config.rms_norm_eps
DEFAULT_LINEARITY = 1e-6  # target bound on s^2 ms(z) / eps: the norm deviates from linear by at most half of it


def deepseek_v3_config(model: nn.Module) -> DeepseekV3Config:
    """The DeepSeek-V3 config equivalent to a deployable MLA Llama model."""
    src = model.config
    layers = mla_layers(model)
    first = layers[0]
    if len({(a.rope_dims, tuple(a.rope_index.tolist())) for a in layers}) != 1:
        raise InvalidInputError("every layer must keep the same rotary pairs to share DeepSeek-V3's rotary embedding")
    theta = src.rope_parameters["rope_theta"]
    dh, d_r = first.head_dim, first.rope_dims
    original = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))
    kept = original[first.rope_index[: d_r // 2]]
    # LongRoPE: inv_freq_j = 1 / (factor_j * theta^(2j / d_r)); solve for the factors that give the kept frequencies
    factors = (1.0 / (kept * theta ** (torch.arange(0, d_r, 2, dtype=torch.float64) / d_r))).tolist()
    return DeepseekV3Config(
        vocab_size=src.vocab_size, hidden_size=src.hidden_size, intermediate_size=src.intermediate_size,
        num_hidden_layers=src.num_hidden_layers, num_attention_heads=first.num_heads, num_key_value_heads=first.num_heads,
        kv_lora_rank=max(a.latent_rank for a in layers), q_lora_rank=None, qk_rope_head_dim=d_r,
        qk_nope_head_dim=dh, v_head_dim=dh, first_k_dense_replace=src.num_hidden_layers, n_routed_experts=1, n_group=1,
        topk_group=1, num_experts_per_tok=1, num_mtp_layers=0, hidden_act=src.hidden_act,
        max_position_embeddings=src.max_position_embeddings, rms_norm_eps=src.rms_norm_eps, tie_word_embeddings=src.tie_word_embeddings,
        bos_token_id=src.bos_token_id, eos_token_id=src.eos_token_id, pad_token_id=src.pad_token_id, attention_bias=False,
        rope_interleave=False,
        rope_parameters={"rope_type": "longrope", "rope_theta": theta, "short_factor": factors, "long_factor": factors,
                         "original_max_position_embeddings": src.max_position_embeddings, "factor": 1.0, "attention_factor": 1.0},
    )


@torch.no_grad()
def to_deepseek_v3(model: nn.Module, linearity: float = DEFAULT_LINEARITY) -> DeepseekV3ForCausalLM:
    """A `DeepseekV3ForCausalLM` (fp32, eval) computing what the deployable MLA `model` computes."""
    if not 0 < linearity < 1:
        raise InvalidInputError(f"linearity must be in (0, 1), got {linearity}")
    config = deepseek_v3_config(model)
    out = DeepseekV3ForCausalLM(config).float().eval()
    r_max, d_r = config.kv_lora_rank, config.qk_rope_head_dim
    src_layers, dst_layers = decoder_layers(model), out.model.layers
    out.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
    out.model.norm.weight.copy_(model.model.norm.weight)
    if not config.tie_word_embeddings:
        out.lm_head.weight.copy_(model.lm_head.weight)
    for src, dst in zip(src_layers, dst_layers):
        a, b = src.self_attn, dst.self_attn
        nh, dh, rk, rv, r = a.num_heads, a.head_dim, a.k_rank, a.v_rank, a.latent_rank
        for name in ("input_layernorm", "post_attention_layernorm"):
            getattr(dst, name).weight.copy_(getattr(src, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(dst.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
        b.o_proj.weight.copy_(a.o_proj.weight)
        fold = math.sqrt((dh + d_r) / dh)  # DeepSeek scales scores by 1/sqrt(dh + d_r); we used 1/sqrt(dh)
        q = torch.cat([a.q_proj.weight.view(nh, dh, -1), a.q_rope_proj.weight.view(nh, d_r, -1)], dim=1)
        b.q_proj.weight.copy_((q * fold).reshape(nh * (dh + d_r), -1))
        # Hard bound on the latent's mean square: ||z||^2 <= sigma_max(W_a)^2 ||x||^2, ||x||^2 <= D max(gain)^2.
        w_latent = a.kv_a_proj.weight[:r].double()
        x_sq = src.input_layernorm.weight.double().abs().max() ** 2 * w_latent.size(1)
        bound = torch.linalg.matrix_norm(w_latent, ord=2) ** 2 * x_sq / r_max
        scale = math.sqrt(linearity * NORM_EPS / max(float(bound), 1e-30))
        kv_a = torch.zeros(r_max + d_r, w_latent.size(1), dtype=torch.float64)
        kv_a[:r] = w_latent * scale
        kv_a[r_max:] = a.kv_a_proj.weight[r:].double()
        b.kv_a_proj_with_mqa.weight.copy_(kv_a)
        b.kv_a_layernorm.weight.fill_(math.sqrt(NORM_EPS) / scale)
        groups = a.head_group
        k_up = a.k_up.weight.view(a.num_kv_heads, dh, rk)[groups]  # [nh, dh, rk]
        v_up = a.v_up.weight.view(a.num_kv_heads, dh, rv)[groups]
        kv_b = torch.zeros(nh, 2 * dh, r_max)
        v_from = 0 if a.joint else rk  # a joint latent is DeepSeek's own form; a split one gives a block-diagonal kv_b
        kv_b[:, :dh, :rk] = k_up
        kv_b[:, dh:, v_from : v_from + rv] = v_up
        b.kv_b_proj.weight.copy_(kv_b.reshape(nh * 2 * dh, r_max))
    return out


def export_deepseek_v3(model: nn.Module, folder: str | Path, tokenizer: PreTrainedTokenizerBase | None = None,
                       linearity: float = DEFAULT_LINEARITY, overwrite: bool = False) -> Path:
    """Write `model` as a DeepSeek-V3 checkpoint (safetensors + config.json [+ tokenizer] + rankwise's manifest)
    atomically; returns the folder.

    `AutoModelForCausalLM.from_pretrained(folder)` (or `rankwise.models.load_model(folder)`) loads it offline; the
    manifest beside the stock files is ignored by transformers and checked by `load_deepseek_v3`.
    """
    exported = to_deepseek_v3(model, linearity)
    # How it was made goes in the manifest, not config.json: config.json stays a stock DeepSeek-V3 config, and the
    # manifest's rankwise_format tells `rankwise info` and the commands that this is a deployable MLA.
    made = {k: v for k, v in (deploy_info(model) or {}).items() if isinstance(v, (int, float, str, bool, list, type(None)))}
    made["source_model_type"] = getattr(model.config, "model_type", None)

    def write(tmp: Path) -> None:
        exported.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    return save_model_folder(folder, write, format_name=FORMAT, extra_manifest={"mla_deploy": made}, overwrite=overwrite)


def load_deepseek_v3(folder: str | Path) -> DeepseekV3ForCausalLM:
    """Reload an exported checkpoint with stock transformers (fp32, eval); a broken folder raises CorruptFileError.

    The folder's manifest is verified first (an altered or truncated file is detected, not loaded).
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise CorruptFileError(f"{folder} has no config.json; export it with export_deepseek_v3 first")
    if not (folder / MANIFEST_NAME).is_file():
        raise CorruptFileError(f"{folder} has no {MANIFEST_NAME}: it was not written by export_deepseek_v3 (export it again)")
    verify_manifest(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise CorruptFileError(f"{folder} is not a loadable checkpoint ({e})") from e
    return model.eval()
