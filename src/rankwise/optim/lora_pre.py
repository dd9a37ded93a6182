"""LoRA-Pre: AdamW whose two moments are kept as low-rank factors for 2-D parameters.

Paper: "Taming Momentum: Rethinking Optimizer States Through Low-Rank Approximation" (Wang et al., ICLR 2026).

For a 2-D parameter W [p, q] with gradient g, the state is four thin factors instead of two full moments:
    first moment   m ~ m_B @ m_A                   m_B [p, r], m_A [r, q]   regressed on g
    second moment  v ~ (v_B @ v_A) ** 2 (elementwise)  v_B [p, r], v_A [r, q]   regressed on |g|
2 (p + q) r floats instead of AdamW's 2 p q. Each step (see `low_rank_regression` for the factor update):
    1. m_prev = m_B m_A and v_prev = (v_B v_A)^2, from the factors before this step (`use_updated_factors=False`,
       the default: the EMA with its previous moment replaced by the low-rank surrogate) or after it (True);
    2. one Newton step of (m_B, m_A) towards g with gamma1 = 1 - sqrt(beta1), and of (v_B, v_A) towards |g| with
       gamma2 = 1 - beta2^(1/4), so the reconstructed moments forget at Adam's rates;
    3. m = beta1 m_prev + (1-beta1) g,  v = beta2 v_prev + (1-beta2) g^2, then the AdamW update with bias correction
       and decoupled weight decay as torch.optim.AdamW does it — except that v's bias correction, by default, matches
       how the factored v builds up from zero (`v_bias_correction`, see `surrogate_v_correction`).
Parameters that are not 2-D, and every parameter of a group with `rank=None`, get plain AdamW, bit-identical to
`torch.optim.AdamW(foreach=False)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.adamw import adamw as functional_adamw  # torch.optim.AdamW's own update, fused kernel included

from rankwise.errors import InvalidInputError, NumericalError
from rankwise.optim.lora_pre_streamed import BLOCK_NUMEL, AdamFactorStep, streamed_adam_factor_steps_
from rankwise.optim.low_rank_regression import DEFAULT_RIDGE, gamma_for_beta, newton_factor_step_

NONFINITE_POLICIES = ("raise", "skip")
V_BIAS_CORRECTIONS = ("adam", "surrogate")
FACTOR_KEYS = ("m_B", "m_A", "v_B", "v_A")
DENSE_KEYS = ("exp_avg", "exp_avg_sq")

# Keys torch.optim.Optimizer itself may add to `defaults` / param groups (not hyperparameters of this optimizer).
TORCH_GROUP_KEYS = frozenset({"differentiable", "foreach", "fused", "capturable", "maximize"})


class LoRAPre(torch.optim.Optimizer):
    """AdamW with rank-`rank` factored first and second moments for 2-D parameters.

    Args:
        params: parameters or param groups. A group may set its own `rank` (None: plain AdamW for the whole group)
            and any other hyperparameter below.
        lr, betas, eps, weight_decay: as in torch.optim.AdamW, defaults included (weight decay is decoupled).
        rank: rank r of the moment factors; must not exceed min(p, q) of any 2-D parameter it applies to.
        ridge: relative ridge of the r x r Gram solves (times trace/r).
        init_std: the A factors start as N(0, init_std^2), the B factors at zero.
        init: "zero" (default): the start above, the moments build up from zero; or "svd": the factors start at
            the rank-r SVD fits of the first gradient g_1 and of |g_1| (the card's alternative), with no bias
            correction (see rankwise.optim.lora_pre_init). Directions with no singular value keep the zero start.
        use_updated_factors: reconstruct the previous moments from the factors after this step's regression
            instead of before it (the paper's ordering here is ambiguous; False is the default reading).
        v_bias_correction: "surrogate" (default): divide v by the fraction of g^2 the factored v holds after t steps
            of a constant gradient, beta2 (1 - beta2^((t-1)/2))^2 + 1 - beta2; or "adam": Adam's 1 - beta2^t, the
            literal reading of the card. The factors of v build up at rate sqrt(beta2) per step on |g|, so their
            square grows far slower than Adam's EMA of g^2: with Adam's correction v is underestimated for the first
            ~1/(1-beta2) steps (28x at step 100), inflating the steps — full-rank LoRA-Pre then diverges where AdamW
            trains (measured in the reproduction); with the surrogate correction it matches AdamW's steps.
        fused: the parameters on the plain-AdamW path (embeddings, norms, rank=None groups) use torch's fused AdamW
            kernel and then equal `torch.optim.AdamW(fused=True)` bit for bit; False (default): AdamW's
            single-tensor loop, equal to `torch.optim.AdamW(foreach=False)`, torch's CPU default. On a CPU the fused
            kernel is several times faster (benchmarks/bench_lora_pre.py); the factored matrices are unaffected.
        nonfinite: "raise" (NumericalError) or "skip" (the whole step is skipped, state untouched, counted in
            `skipped_steps`) when any gradient holds NaN or Inf.
        seed: seeds the random initialisation of the A factors, so runs (and DDP ranks) agree.
    """

    # The per-parameter factor names, B before A for each moment; subclasses that keep other factors override it.
    factor_keys: tuple[str, ...] = FACTOR_KEYS
    # True: same-shape matrices are updated together (`_factored_bucket_step`); False: one at a time by the reference
    # `_factored_step`, which the batched path must equal up to float rounding. Settable per instance.
    batched_step: bool = True
    # At most this many matrix entries per batched update (bounds the stacked copies of a bucket's factors and, in
    # subclasses that form [p, q] temporaries per bucket, their memory).
    bucket_numel: int = 2**23
    # Entries per row block of the streamed step (`lora_pre_streamed.BLOCK_NUMEL`: its temporaries fit in L2).
    block_numel: int = BLOCK_NUMEL
    # Hyperparameters added after states were first saved, with the value that reproduces those runs: a state saved
    # before `v_bias_correction` existed was trained with Adam's correction, so it resumes with it.
    legacy_group_defaults: dict[str, Any] = {"v_bias_correction": "adam", "init": "zero", "fused": False}

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        rank: int | None = 8,
        *,
        ridge: float = DEFAULT_RIDGE,
        init_std: float = 0.02,
        init: str = "zero",
        use_updated_factors: bool = False,
        v_bias_correction: str = "surrogate",
        fused: bool = False,
        nonfinite: str = "raise",
        seed: int = 0,
    ) -> None:
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, rank=rank,
            ridge=ridge, init_std=init_std, use_updated_factors=use_updated_factors, v_bias_correction=v_bias_correction,
            init=init, fused=fused,
        )
        self._setup(params, defaults, nonfinite, seed)

    def _setup(self, params: Any, defaults: dict[str, Any], nonfinite: str, seed: int) -> None:
        """torch.optim.Optimizer's __init__ with `defaults` (checking every group), plus LoRAPre's own attributes;
        shared with subclasses whose hyperparameters differ."""
        if nonfinite not in NONFINITE_POLICIES:
            raise InvalidInputError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        super().__init__(params, defaults)
        self.nonfinite = nonfinite
        self.seed = int(seed)
        self.skipped_steps = 0

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's add_param_group (used by __init__ too), then a check of the group's rank and rates."""
        super().add_param_group(param_group)
        try:
            self._check_group(self.param_groups[-1])
        except InvalidInputError:
            self.param_groups.pop()  # leave the optimizer as it was
            raise

    def _check_group(self, group: dict[str, Any]) -> None:
        """Raise InvalidInputError if a group's hyperparameters are out of range (a hook for subclasses)."""
        _check_group(group)

    # ---- the step ----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if any(p.grad is not None and p.grad.is_sparse for g in self.param_groups for p in g["params"]):
            raise InvalidInputError(f"{type(self).__name__} does not support sparse gradients; use dense embeddings")
        if not self._gradients_finite():
            if self.nonfinite == "raise":
                raise NumericalError(
                    "a gradient holds NaN or Inf; the optimizer state was left unchanged. Lower the learning rate, "
                    f"check the loss, or construct {type(self).__name__}(..., nonfinite='skip') to skip such steps"
                )
            self.skipped_steps += 1
            return loss
        index = 0
        for group in self.param_groups:
            buckets: dict[tuple, list[torch.Tensor]] = {}
            fused_dense: list[torch.Tensor] = []
            for p in group["params"]:
                if p.grad is not None:
                    if not is_factored(p, group):
                        if group.get("fused", False):
                            fused_dense.append(p)
                        else:
                            self._dense_step(p, group)
                    elif self.batched_step and self.state[p]:
                        # same shape, dtype, device and step count: one batched update (the step count fixes the
                        # bias corrections, which a parameter that missed a gradient would not share)
                        key = (tuple(p.shape), p.dtype, p.device, float(self.state[p]["step"]))
                        buckets.setdefault(key, []).append(p)
                    else:  # a fresh state (its initialisation may read the gradient), or the reference path
                        self._factored_step(p, group, index)
                index += 1
            if fused_dense:
                self._fused_dense_step(fused_dense, group)
            for params in buckets.values():
                for chunk in _chunks(params, self.bucket_numel):
                    self._factored_bucket_step(chunk, group)
        return loss

    def _gradients_finite(self) -> bool:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return True
        # A sum is one vectorised read and is non-finite whenever an entry is; isfinite().all() writes a mask of
        # every entry first (3x slower). Only a sum that overflowed with all entries finite needs the exact check.
        sums = torch.stack([g.sum(dtype=torch.float64 if g.dtype == torch.float64 else torch.float32) for g in grads])
        if bool(torch.isfinite(sums).all()):
            return True
        return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())

    def _fused_dense_step(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """torch.optim.AdamW(fused=True)'s update of `params`, through torch's own functional AdamW with the same
        state layout (step, exp_avg, exp_avg_sq) as `_dense_step`."""
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        functional_adamw(
            params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
            [s["step"] for s in states], fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
        )

    def _dense_step(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        """torch.optim.AdamW's single-tensor update, operation for operation (so results agree bit for bit)."""
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        state["step"] += 1
        if wd != 0:
            p.mul_(1 - lr * wd)
        state["exp_avg"].lerp_(p.grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        step = state["step"].item()
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (state["exp_avg_sq"].sqrt() / bias_correction2_sqrt).add_(eps)
        p.addcdiv_(state["exp_avg"], denom, value=-(lr / bias_correction1))

    def _factored_step(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        state = self.state[p]
        if not state:
            state.update(self._initial_factors(p, group, index))
        beta1, beta2 = group["betas"]
        lr, eps, wd, ridge = group["lr"], group["eps"], group["weight_decay"], group["ridge"]
        # Factors and moments in float32 at least, even for bf16 weights (the Gram solves need it).
        g = p.grad.float() if p.dtype in (torch.float16, torch.bfloat16) else p.grad
        m_b, m_a, v_b, v_a = (state[k] for k in FACTOR_KEYS)
        state["step"] += 1
        if not group["use_updated_factors"]:
            m_prev, v_prev = m_b @ m_a, (v_b @ v_a).square_()
        newton_factor_step_(m_b, m_a, g, gamma_for_beta(beta1, 2), ridge)
        newton_factor_step_(v_b, v_a, g.abs(), gamma_for_beta(beta2, 4), ridge)
        if group["use_updated_factors"]:
            m_prev, v_prev = m_b @ m_a, (v_b @ v_a).square_()
        exp_avg = m_prev.mul_(beta1).add_(g, alpha=1 - beta1)
        exp_avg_sq = v_prev.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if wd != 0:
            p.mul_(1 - lr * wd)
        step = state["step"].item()
        bias_correction1 = 1 - beta1**step
        if group["v_bias_correction"] == "surrogate":
            built = step if group["use_updated_factors"] else step - 1  # regressions the blended factors have seen
            bias_correction2_sqrt = surrogate_v_correction(beta2, built) ** 0.5
        else:
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        p.add_((exp_avg / denom).to(p.dtype), alpha=-(lr / bias_correction1))

    def _factored_bucket_step(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """`_factored_step` for n same-shape parameters whose states exist and share a step count.

        One cache-sized pass of row blocks over each gradient does both Newton regressions, the reconstruction of
        the previous moments and the AdamW update (`streamed_adam_factor_steps_`); the r x r Grams, inverses and
        solves of the n matrices run batched. The [p, q] moments are never formed whole:
            m = beta1 m_B m_A + (1-beta1) g                one addmm per block;
            sqrt(v) = sqrt(1-beta2) hypot(c v_B v_A, g)    c = sqrt(beta2 / (1-beta2)) folded into v_B;
            p <- p - lr/bc1 m / (sqrt(v)/bc2 + eps)         one addcdiv, the scalars folded in.
        Equal to the per-matrix reference `_factored_step` up to float rounding (tests/optim/test_lora_pre_batched.py).
        """
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1.0)
        step = float(steps[0])  # a CPU counter, as torch's AdamW keeps it: no device sync
        if group["v_bias_correction"] == "surrogate":
            built = step if group["use_updated_factors"] else step - 1  # regressions the blended factors have seen
            bias_correction2_sqrt = surrogate_v_correction(beta2, built) ** 0.5
        else:
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        hp = AdamFactorStep(
            beta1=beta1, beta2=beta2, gamma1=gamma_for_beta(beta1, 2), gamma2=gamma_for_beta(beta2, 4), lr=group["lr"],
            eps=group["eps"], weight_decay=group["weight_decay"], ridge=group["ridge"],
            bias_correction1=1 - beta1**step, bias_correction2_sqrt=bias_correction2_sqrt,
            use_updated_factors=group["use_updated_factors"],
        )
        new = streamed_adam_factor_steps_(params, [[s[k] for s in states] for k in FACTOR_KEYS], hp, self.block_numel)
        for k, stacked in zip(FACTOR_KEYS, new):
            torch._foreach_copy_([s[k] for s in states], list(stacked.unbind(0)))

    def _initial_factors(self, p: torch.Tensor, group: dict[str, Any], index: int) -> dict[str, torch.Tensor]:
        """B factors at zero, A factors N(0, init_std^2) from a generator keyed by (seed, parameter index); with
        init="svd", the rank-r SVD fits of the first gradient p.grad and of its absolute value instead."""
        if group.get("init", "zero") == "svd":
            from rankwise.optim.lora_pre_init import first_gradient_factor_state

            return first_gradient_factor_state(p, p.grad, group["rank"], group["init_std"], self.seed, index, self.factor_keys)
        return initial_factor_state(p, group["rank"], group["init_std"], self.seed, index, self.factor_keys)

    @torch.no_grad()
    def low_rank_moments(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rank-r moments currently held for a factored parameter: (m_B m_A, (v_B v_A)^2), each [p, q].

        These are the surrogates of the previous step's moments that the next step blends with its gradient.
        """
        state = self.state.get(p)
        if not state or "m_B" not in state:
            raise InvalidInputError("this parameter has no low-rank state (not factored, or no step taken yet)")
        return state["m_B"] @ state["m_A"], (state["v_B"] @ state["v_A"]).square()

    # ---- loading -----------------------------------------------------------------------------------------------

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by `state_dict()`, after checking that it fits these parameters (shapes and ranks)."""
        if isinstance(state_dict, dict) and isinstance(state_dict.get("param_groups"), list):
            state_dict = {**state_dict, "param_groups": [
                {**self.legacy_group_defaults, **g} if isinstance(g, dict) else g for g in state_dict["param_groups"]]}
        self._check_loadable(state_dict)
        super().load_state_dict(state_dict)
        # torch casts loaded state to each parameter's dtype; factors of bf16/fp16 weights must stay in float32.
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            for key, p in zip(saved["params"], group["params"]):
                entry = state_dict["state"].get(key, {})
                if self.factor_keys[0] in entry and p.dtype in (torch.float16, torch.bfloat16):
                    for k in self.factor_keys:
                        self.state[p][k] = entry[k].to(device=p.device, dtype=torch.float32)

    def _check_loadable(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise InvalidInputError("not an optimizer state dict (needs 'state' and 'param_groups')")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise InvalidInputError(
                f"the state has {len(saved_groups)} parameter groups but this optimizer has {len(self.param_groups)}; "
                "build the optimizer with the same groups as the one that was saved"
            )
        for saved, group in zip(saved_groups, self.param_groups):
            # torch replaces each group's hyperparameters by the saved ones: a state saved by another optimizer
            # (LoRAPre vs LoRAPreMuon) would lack keys this one's step reads.
            # (torch's own bookkeeping keys, which Optimizer.__setstate__ adds to `defaults` on the first load, are
            # not ours to require: without this, loading a state twice was refused.)
            missing = sorted(k for k in self.defaults if k not in saved and k not in TORCH_GROUP_KEYS)
            if missing:
                raise InvalidInputError(
                    f"a saved parameter group lacks {missing}: the state was not saved by {type(self).__name__}; "
                    "load it into the optimizer that saved it"
                )
            if len(saved["params"]) != len(group["params"]):
                raise InvalidInputError(
                    f"a saved parameter group has {len(saved['params'])} parameters, this one {len(group['params'])}: "
                    "the model changed between save and load"
                )
            for key, p in zip(saved["params"], group["params"]):
                entry = state_dict["state"].get(key)
                if entry:
                    _check_entry(entry, p, saved, key, self.factor_keys)


def initial_factor_state(
    p: torch.Tensor, rank: int, init_std: float, seed: int, index: int, factor_keys: tuple[str, ...] = FACTOR_KEYS
) -> dict[str, torch.Tensor]:
    """Fresh state of a factored parameter p [rows, cols]: a float32 step counter at 0 and, for each (B, A) pair of
    `factor_keys`, B [rows, rank] at zero and A [rank, cols] ~ N(0, init_std^2).

    The A factors are drawn in order from one CPU generator keyed by (seed, parameter index), so reruns and DDP
    ranks agree whatever the device. Factors are float32 for fp16/bf16 weights (the Gram solves need it).
    """
    rows, cols = p.shape
    dtype = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    state: dict[str, torch.Tensor] = {"step": torch.tensor(0.0, dtype=torch.float32)}
    for b_key, a_key in zip(factor_keys[0::2], factor_keys[1::2]):
        state[b_key] = torch.zeros(rows, rank, dtype=dtype, device=p.device)
        state[a_key] = (torch.randn(rank, cols, generator=gen, dtype=torch.float32) * init_std).to(p.device, dtype)
    return state


def _chunks(params: list[torch.Tensor], numel: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of `params` holding at most `numel` entries each (a larger parameter is a run by itself)."""
    runs: list[list[torch.Tensor]] = [[]]
    total = 0
    for p in params:
        if runs[-1] and total + p.numel() > numel:
            runs.append([])
            total = 0
        runs[-1].append(p)
        total += p.numel()
    return runs


def surrogate_v_correction(beta2: float, regressions: int) -> float:
    """Fraction of g^2 that v = beta2 (v_B v_A)^2 + (1 - beta2) g^2 holds for a constant gradient g when the factors,
    started at zero, have taken `regressions` steps towards |g| (their product reaches 1 - beta2^(k/2) of |g|)."""
    return beta2 * (1 - beta2 ** (regressions / 2)) ** 2 + (1 - beta2)


def is_factored(p: torch.Tensor, group: dict[str, Any]) -> bool:
    """Whether LoRA-Pre keeps low-rank moments for `p` in `group` (a 2-D parameter in a group with a rank)."""
    return group["rank"] is not None and p.dim() == 2


def _check_group(group: dict[str, Any]) -> None:
    check_adamw_rates(group)
    if not isinstance(group.get("fused", False), bool):
        raise InvalidInputError(f"fused must be True or False, got {group.get('fused')!r}")
    if group["v_bias_correction"] not in V_BIAS_CORRECTIONS:
        raise InvalidInputError(f"v_bias_correction must be one of {V_BIAS_CORRECTIONS}, got {group['v_bias_correction']!r}")
    if group.get("init", "zero") not in ("zero", "svd"):  # rankwise.optim.lora_pre_init.FACTOR_INITS
        raise InvalidInputError(f"init must be 'zero' or 'svd', got {group.get('init')!r}")
    check_group_rank(group)


def check_adamw_rates(group: dict[str, Any]) -> None:
    """The AdamW hyperparameters of a group (betas in [0, 1), non-negative lr, eps, weight_decay, ridge)."""
    beta1, beta2 = group["betas"]
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):  # written so that a NaN fails it too
        raise InvalidInputError(f"betas must lie in [0, 1), got {group['betas']}")
    for name in ("lr", "eps", "weight_decay", "ridge"):
        value = group[name]
        # `not 0 <= v < inf` refuses NaN (every comparison with NaN is false), which `v < 0` would let through
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < math.inf:
            raise InvalidInputError(f"{name} must be a finite number >= 0, got {value!r}")


def check_group_rank(group: dict[str, Any]) -> None:
    """A group's rank is None (plain AdamW) or a positive int no larger than min(p, q) of any of its matrices."""
    rank = group["rank"]
    if rank is None:
        return
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidInputError(f"rank must be a positive int or None (plain AdamW), got {rank!r}")
    for p in group["params"]:
        if p.dim() == 2 and rank > min(p.shape):
            raise InvalidInputError(
                f"rank {rank} exceeds the smaller dimension of a parameter of shape {tuple(p.shape)}; use rank <= "
                f"{min(p.shape)} or put that parameter in a group with rank=None (plain AdamW)"
            )


def _check_entry(
    entry: dict[str, Any], p: torch.Tensor, saved_group: dict[str, Any], key: int, factor_keys: tuple[str, ...] = FACTOR_KEYS
) -> None:
    """One saved per-parameter state must match the current parameter's shape (and the saved group's rank).

    `factor_keys` name B factors (shape [p, r]) and A factors ([r, q]) by their suffix."""
    where = f"saved state #{key} (current parameter shape {tuple(p.shape)})"
    if factor_keys[0] in entry:
        r = saved_group.get("rank")
        if p.dim() != 2 or r is None:
            raise InvalidInputError(f"{where} holds low-rank factors, but the parameter is not a 2-D factored one: the model changed")
        expected = {k: (p.shape[0], r) if k.endswith("_B") else (r, p.shape[1]) for k in factor_keys}
    elif "exp_avg" in entry:
        expected = {k: tuple(p.shape) for k in DENSE_KEYS}
    else:
        raise InvalidInputError(f"{where} has neither low-rank factors nor AdamW moments: not a LoRAPre state")
    for k, shape in expected.items():
        t = entry.get(k)
        if t is None:
            raise InvalidInputError(
                f"{where} has no {k}: the state was not saved by this optimizer (another LoRA-Pre variant, or another "
                "optimizer); load it into the optimizer that saved it"
            )
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            found = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise InvalidInputError(
                f"{where}: {k} has shape {found}, expected {tuple(shape)}; the parameter changed shape between save "
                "and load (or the rank changed): load a matching checkpoint or start the optimizer afresh"
            )
