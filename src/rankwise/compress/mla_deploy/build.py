"""Build a deployable MLA model from a Llama-family GQA model: decoupled RoPE + CARE-factored latent K/V.

    mla = convert_to_deployable_mla(model, kv_rank=80, rope_dims=32, rope_selection="contribution",
                                    calibration=calibration_windows(token_windows(tokenizer, "calibration", 32)))

Per layer, with the input second moment C of k_proj/v_proj (CARE's calibration, shared with issue 3's code):
  1. RoRoPE concentration and a global selection of k = rope_dims / 2 rotary pairs (`rope.py`);
  2. the shared rope key and per-head rope queries are cut out of W_K / W_Q exactly; the no-RoPE remainder of W_K
     and all of W_V are factored by CARE's sqrt(C)-whitened SVD (`compress.mla.factorize`, `core.linalg`) at
     ranks from `compress.mla.allocation` (uniform, or CARE's adjusted water-filling with separate K/V budgets),
     or, with method="mha2mla", by one SVD of [W_K_nope; W_V] into a joint latent of width 2 kv_rank;
  3. the layer's attention becomes `MLAAttention`, caching 2 kv_rank + rope_dims numbers per token (mean).
The result is still a `LlamaForCausalLM` (embeddings, norms, MLPs untouched) whose `generate` uses a DynamicCache
that holds only latents. `export.py` writes it as a stock DeepSeek-V3 checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from rankwise.compress.mla.allocation import allocate_ranks
from rankwise.compress.mla.calibration import kv_input_moments
from rankwise.compress.mla.factorize import DEFAULT_DAMPING, JOINT_METHODS, canonical_method, check_damping, decompose_layer, split_joint
from rankwise.compress.mla.layout import decoder_layers, kv_layout
from rankwise.compress.mla_deploy.attention import MLAAttention
from rankwise.compress.mla_deploy.rope import concentrate_pairs, decouple_rope, pair_contribution, rope_columns, rotation_sensitivity, select_pairs
from rankwise.core.calibration import SecondMoment
from rankwise.core.threads import limit_threads
from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError, NumericalError

CONFIG_KEY = "rankwise_mla_deploy"
NEW_PARAMETERS = ("q_rope_proj", "kv_a_proj", "k_up", "v_up")  # what the conversion introduces (healing trains them)


def convert_to_deployable_mla(
    model: nn.Module,
    kv_rank: int,
    rope_dims: int = 32,
    rope_selection: str = "high",
    calibration: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, SecondMoment] | None = None,
    *,
    allocation: str = "uniform",
    score: str = "paper",
    damping: float | None = None,
    method: str = "care",
    absorb: bool = True,
    use_cache: bool = True,
    rope_context: int = 2048,
) -> nn.Module:
    """A copy of `model` whose attention layers are `MLAAttention` with a latent-only cache.

    kv_rank: mean latent rank per matrix (r_K and r_V); rope_dims: width of the shared rope key (even, <= head_dim).
    The cache holds 2 * kv_rank + rope_dims numbers per token and layer, against 2 * kv_width for the GQA model
    (SmolLM2: kv_rank=80, rope_dims=32 -> 192 of 384, a 50 % saving). calibration: token ids [N, T] or batches, or
    moments keyed by k_proj name (required: CARE and the contribution ranking are data-driven). damping: relative
    to mean(diag C) (the method's default: CARE 0.1). method: the latent factorization, CARE's whitened SVD or a
    baseline from `compress.mla.METHODS` ("svd" is Palu's plain SVD of each matrix; "mha2mla" MHA2MLA's joint SVD,
    one latent of width 2 kv_rank that K and V share, the same cache). rope_context: the distance range the 'sensitivity' selection averages over.
    The original model is not modified.
    """
    layout = kv_layout(model)
    if calibration is None:
        raise InvalidInputError("deployable MLA needs calibration data: pass calibration=token ids [N, T] (e.g. calibration_windows(token_windows(tokenizer, 'calibration', 32)))")
    if not isinstance(rope_dims, int) or rope_dims < 2 or rope_dims % 2 or rope_dims > layout.head_dim:
        raise InvalidInputError(f"rope_dims must be an even integer in [2, {layout.head_dim}] (the head dim), got {rope_dims!r}")
    if not isinstance(kv_rank, int) or not 1 <= kv_rank <= layout.kv_width:
        raise InvalidInputError(f"kv_rank must be an integer in [1, {layout.kv_width}], got {kv_rank!r}")
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        if any(getattr(attn, n).bias is not None for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            raise InvalidInputError(f"layer {i} has attention biases, which deployable MLA does not support")
    if getattr(model.config, "rope_parameters", {}).get("rope_type", "default") != "default":
        raise InvalidInputError("deployable MLA supports the default RoPE only (no scaled RoPE variants)")
    # A latent cache larger than the GQA one (2 kv_rank + rope_dims > 2 kv_width) is allowed here: full-rank parity
    # checks need it. `rankwise convert mla --deploy`, whose purpose is the saving, refuses it.
    method = canonical_method(method)
    joint = method in JOINT_METHODS
    check_damping(damping)
    damping = DEFAULT_DAMPING[method] if damping is None else float(damping)

    moments = kv_input_moments(model, calibration, use_cache=use_cache)
    dh, nh, g = layout.head_dim, layout.num_heads, layout.num_kv_heads
    weights, concentrations, scores = [], [], []
    splits, decomps = [], []
    with limit_threads(1, at_most=True):  # small float64 eigh/SVDs: multithreaded LAPACK only spin-waits on busy cores
        for layer, moment in zip(layers, moments):
            attn = layer.self_attn
            # RoRoPE (`rope.py`) works on columns of the math-layout W_Q, W_K [D, heads * dh]; the factorization
            # takes torch-layout weights [out, D] (W_V here, and the no-RoPE key transposed back below).
            w_q, w_k = (getattr(attn, n).weight.detach().T.double() for n in ("q_proj", "k_proj"))
            w_v = attn.v_proj.weight.detach().double()
            c = moment.covariance()
            conc = concentrate_pairs(w_k, c, g, dh)
            weights.append((w_q, w_k, w_v))
            concentrations.append(conc)
            scores.append(pair_contribution(w_q, c, conc, nh, g, dh))
        if rope_selection == "sensitivity":
            inv_freq = model.model.rotary_emb.inv_freq.detach()
            scores = [s * rotation_sensitivity(inv_freq, rope_context) for s in scores]
        pairs = select_pairs(rope_selection, rope_dims // 2, dh // 2, scores)
        for (w_q, w_k, w_v), conc, moment in progress(list(zip(weights, concentrations, moments)), desc="factorizing MLA layers"):
            split = decouple_rope(w_q, w_k, conc, pairs, nh, g, dh)
            splits.append(split)
            decomps.append(decompose_layer(split.k_nope.T, w_v, method, moment, damping))
        if joint:  # one latent of twice the per-matrix rank: the same numbers cached as r_K + r_V
            k_ranks = v_ranks = allocate_ranks([d[0].sigma for d in decomps], 2 * kv_rank, allocation, score)
            truncated = [split_joint(d[0].truncate(r), d[0].split) for d, r in zip(decomps, k_ranks)]
        else:
            k_ranks = allocate_ranks([d[0].sigma for d in decomps], kv_rank, allocation, score)
            v_ranks = allocate_ranks([d[1].sigma for d in decomps], kv_rank, allocation, score)
            truncated = [(d[0].truncate(rk), d[1].truncate(rv)) for d, rk, rv in zip(decomps, k_ranks, v_ranks)]

    target = copy.deepcopy(model)
    dtype = next(model.parameters()).dtype
    index = rope_columns(pairs, dh)
    for i, (layer, split, (k_f, v_f)) in enumerate(zip(decoder_layers(target), splits, truncated)):
        old = layer.self_attn
        new = MLAAttention(layout.hidden_size, nh, g, dh, k_ranks[i], v_ranks[i], index, old.layer_idx, absorb, joint=joint)
        with torch.no_grad():
            new.q_proj.weight.copy_(old.q_proj.weight)
            new.o_proj.weight.copy_(old.o_proj.weight)
            new.q_rope_proj.weight.copy_(split.q_rope.T.to(dtype))
            latent = [k_f.down] if joint else [k_f.down, v_f.down]  # joint: K and V share one down-projection
            new.kv_a_proj.weight.copy_(torch.cat([*latent, split.k_rope.T], dim=0).to(dtype))
            new.k_up.weight.copy_(k_f.up.to(dtype))
            new.v_up.weight.copy_(v_f.up.to(dtype))
        if not all(torch.isfinite(p).all() for p in new.parameters()):
            raise NumericalError(f"layer {i}: the MLA factors are not finite; increase the damping")
        layer.self_attn = new.to(dtype)
    kept = [float((conc.key_energy[pairs].sum() / conc.total_energy[pairs].sum().clamp_min(1e-300))) for conc in concentrations]
    setattr(target.config, CONFIG_KEY, {
        "kv_rank": kv_rank, "k_ranks": k_ranks, "v_ranks": v_ranks, "rope_dims": rope_dims, "rope_selection": rope_selection,
        "rope_pairs": pairs, "rope_context": rope_context, "allocation": allocation, "score": score, "method": method, "joint": joint, "damping": damping,
        "rope_key_energy_kept": kept,  # per layer: share of the kept pairs' key energy that stays rotary after RoRoPE
    })
    return target.eval()


def mla_layers(model: nn.Module) -> list[MLAAttention]:
    """The model's `MLAAttention` modules, in layer order; raises if it is not a deployable MLA model."""
    found = [layer.self_attn for layer in decoder_layers(model) if isinstance(layer.self_attn, MLAAttention)]
    if not found:
        raise InvalidInputError("this model has no MLA attention; convert it with convert_to_deployable_mla first")
    return found


def mla_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters the conversion introduced (`NEW_PARAMETERS` of every MLA layer), by their name in `model`.

    Healing (`rankwise.training.healing.heal`) trains these; q_proj, o_proj and everything outside attention keep
    the original's values and names.
    """
    wanted = {id(p) for attn in mla_layers(model) for n in NEW_PARAMETERS for p in getattr(attn, n).parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) in wanted}


def set_absorb(model: nn.Module, absorb: bool) -> nn.Module:
    """Switch every MLA layer between absorbed (DeepSeek-V2) and expanded decoding; returns the model."""
    for attn in mla_layers(model):
        attn.absorb = bool(absorb)
    return model


def expected_cache_bytes_per_token(model: nn.Module) -> int:
    """What the latent cache should hold per token: sum over layers of (latent width + rope_dims) x element size."""
    layers = mla_layers(model)
    size = layers[0].kv_a_proj.weight.element_size()
    return sum(attn.latent_dims for attn in layers) * size


def deploy_info(model: nn.Module) -> dict | None:
    return getattr(getattr(model, "config", None), CONFIG_KEY, None)
