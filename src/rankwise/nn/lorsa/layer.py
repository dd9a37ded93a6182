"""The Lorsa layer: a sparse replacement of one attention layer by many rank-1 OV heads with shared QK heads.

Shapes: d = d_model, H = n_qk QK heads of width d_qk, n = n_ov OV heads, G = n / H per QK head, K active per token.

    A^h   = softmax(causal(RoPE(x W_Q^h + b_Q^h) RoPE(x W_K^h + b_K^h)^T * scale))     [batch, H, seq, seq]
    z^i   = A^{i // G} (x w_v^i + b_v^i)                                              [batch, seq, n]
    S_t   = the K heads with the largest |z_t^i| * ||w_o^i||                          (per token)
    y_t   = sum_{i in S_t} z_t^i w_o^i + b_O                                          [batch, seq, d]

The layer works in the target's raw units: buffers `input_scale` and `output_scale` (set by the fit, 1 by default)
map raw activations to the normalised space it was trained in (mean token norm sqrt(d)) and back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.nn.lorsa.checks import check_k, check_sequence
from rankwise.nn.lorsa.config import LorsaConfig
from rankwise.nn.lorsa.topk import scatter_dense, sparse_readout, top_k


class Lorsa(nn.Module):
    """Low-rank sparse attention. forward: x [batch, seq, d_model] -> y [batch, seq, d_model], causal.

    Parameters: W_Q, W_K [n_qk * d_qk, d] (QK head h is rows h*d_qk:(h+1)*d_qk), b_Q, b_K [n_qk * d_qk];
    W_V [n_ov, d] (row i is w_v^i), b_V [n_ov]; W_O [n_ov, d] (row i is w_o^i, the direction head i writes); b_O [d].
    """

    def __init__(self, config: LorsaConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.W_Q = nn.Parameter(torch.empty(c.n_qk * c.d_qk, c.d_model))
        self.W_K = nn.Parameter(torch.empty(c.n_qk * c.d_qk, c.d_model))
        self.W_V = nn.Parameter(torch.empty(c.n_ov, c.d_model))
        self.W_O = nn.Parameter(torch.empty(c.n_ov, c.d_model))
        self.b_V = nn.Parameter(torch.zeros(c.n_ov))
        self.b_O = nn.Parameter(torch.zeros(c.d_model))
        if c.qk_bias:
            self.b_Q = nn.Parameter(torch.zeros(c.n_qk * c.d_qk))
            self.b_K = nn.Parameter(torch.zeros(c.n_qk * c.d_qk))
        else:
            self.register_parameter("b_Q", None)
            self.register_parameter("b_K", None)
        self.register_buffer("input_scale", torch.ones(()))
        self.register_buffer("output_scale", torch.ones(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-normal (fan_in) weights and zero biases, as the authors' code; the fit then rescales W_V."""
        for w in (self.W_Q, self.W_K, self.W_V):
            nn.init.normal_(w, std=math.sqrt(2.0 / w.size(1)))
        nn.init.normal_(self.W_O, std=math.sqrt(2.0 / self.W_O.size(0)))
        for b in (self.b_Q, self.b_K, self.b_V, self.b_O):
            if b is not None:
                nn.init.zeros_(b)

    # -- the pieces -----------------------------------------------------------------------------------------------
    def _qk(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised input [B, T, d] -> RoPE'd queries and keys [B, n_qk, T, d_qk]."""
        c = self.config
        B, T, _ = xs.shape
        q = F.linear(xs, self.W_Q, self.b_Q).view(B, T, c.n_qk, c.d_qk).transpose(1, 2)
        k = F.linear(xs, self.W_K, self.b_K).view(B, T, c.n_qk, c.d_qk).transpose(1, 2)
        return c.rope.apply(q), c.rope.apply(k)

    def _values(self, xs: torch.Tensor) -> torch.Tensor:
        """Normalised input [B, T, d] -> per-head values v^i = x w_v^i + b_v^i grouped [B, n_qk, T, G]."""
        c = self.config
        B, T, _ = xs.shape
        return F.linear(xs, self.W_V, self.b_V).view(B, T, c.n_qk, c.group_size).transpose(1, 2)

    def _normalised(self, x: torch.Tensor) -> torch.Tensor:
        check_sequence(x, self.config.d_model)
        return x * self.input_scale.to(x.dtype)

    def activations(self, x: torch.Tensor) -> torch.Tensor:
        """Dense head activations before the top-K: x [B, T, d] -> z [B, T, n_ov]."""
        xs = self._normalised(x)
        q, k = self._qk(xs)
        # One attention per QK head with a G-wide value: the pattern is computed once per group, never per OV head.
        z = F.scaled_dot_product_attention(q, k, self._values(xs), is_causal=True, scale=self.config.scale)
        B, T = x.shape[:2]
        return z.transpose(1, 2).reshape(B, T, self.config.n_ov)

    def selection_scores(self, z: torch.Tensor) -> torch.Tensor:
        """How heads are ranked for the top-K: |z| * ||w_o|| ("abs") or ReLU(z) * ||w_o|| ("relu"). [..., n_ov]"""
        norms = self.W_O.norm(dim=-1).detach()  # a ranking, not a path for gradients
        mag = z.abs() if self.config.selection == "abs" else z.clamp_min(0)
        return mag.detach() * norms

    def codes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the top-K ranks and keeps: x [B, T, d] -> (selection scores, activations), both [B, T, n_ov]."""
        z = self.activations(x)
        return self.selection_scores(z), z

    def encode(self, x: torch.Tensor, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The active heads: x [B, T, d] -> (values [B, T, k], head indices [B, T, k] int64)."""
        k = check_k(self.config.k if k is None else k, self.config.n_ov)
        return top_k(*self.codes(x), k)

    def sparse_activations(self, x: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """Activations after the top-K, zeros for inactive heads: x [B, T, d] -> [B, T, n_ov]."""
        vals, idx = self.encode(x, k)
        return scatter_dense(vals, idx, self.config.n_ov)

    def readout(self, vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """sum of the selected heads' writes z_i w_o^i, normalised units, no bias: [B, T, k] -> [B, T, d]."""
        if idx.size(-1) == self.config.n_ov:
            return scatter_dense(vals, idx, self.config.n_ov) @ self.W_O
        return sparse_readout(vals, idx, self.W_O)

    def decode(self, vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """(values, indices) [B, T, k] -> y [B, T, d] in raw output units."""
        y = self.readout(vals, idx) + self.b_O
        return y / self.output_scale.to(y.dtype)

    def forward(self, x: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """x [batch, seq, d_model] -> y [batch, seq, d_model]; `k` overrides the configured K (e.g. K annealing)."""
        return self.decode(*self.encode(x, k))

    # -- interpretation -------------------------------------------------------------------------------------------
    def patterns(self, x: torch.Tensor) -> torch.Tensor:
        """Attention patterns A [B, n_qk, T, T] (rows sum to 1, zero above the diagonal)."""
        q, k = self._qk(self._normalised(x))
        T = x.size(1)
        scores = (q @ k.transpose(-1, -2)) * self.config.scale
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        return scores.masked_fill(mask, float("-inf")).softmax(dim=-1)

    def z_pattern(self, x: torch.Tensor, head: int) -> torch.Tensor:
        """Per-source contributions to head `head`'s activation: [B, T, T] with z_t = sum_s out[:, t, s]."""
        check_k(head + 1, self.config.n_ov, "heads (head index + 1)")
        xs = self._normalised(x)
        g = head // self.config.group_size
        a = self.patterns(x)[:, g]  # [B, T, T]
        v = F.linear(xs, self.W_V[head:head + 1], self.b_V[head:head + 1])[..., 0]  # [B, T]
        return a * v[:, None, :]

    @torch.no_grad()
    def fold_output_norms_(self) -> Lorsa:
        """w_v <- w_v ||w_o||, b_v <- b_v ||w_o||, w_o <- w_o / ||w_o||: same output, activations comparable across heads."""
        norms = self.W_O.norm(dim=-1).clamp_min(torch.finfo(self.W_O.dtype).tiny)
        self.W_V.mul_(norms[:, None])
        self.b_V.mul_(norms)
        self.W_O.div_(norms[:, None])
        return self

    def extra_repr(self) -> str:
        c = self.config
        return (f"d_model={c.d_model}, n_qk={c.n_qk}, d_qk={c.d_qk}, n_ov={c.n_ov} (G={c.group_size}), k={c.k}, "
                f"rope={c.rope.rotary_dim}/{c.rope.convention}")
