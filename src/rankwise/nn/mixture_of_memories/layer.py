"""Mixture-of-Memories (MoM): several linear-attention memories, a router writing each token to its top-k of them.

Per token t (x_t in R^d_model), with the parts of `linear_attention.py`:

    routing   s_t = softmax(x_t W_g), K_t = top-k(s_t), g_t^m = s_t^m / sum_{K_t} s_t      (`router.py`)
    write     m in K_t:  S_t^m = gamma_h S_{t-1}^m + (k_t^m)^T v_t^m       m not in K_t:  S_t^m = S_{t-1}^m
              the shared memory (optional) is written by every token, like the base layer
    read      o_t = sum_{m in K_t} g_t^m q_t S_t^m + q_t S_t^shared,   y_t = W_o RMSNorm(o_t)

Each memory has its own key / value projections (and short convolutions); the query projection, the per-head decay
and the read-out are shared, as in the released design. A non-routed step is an identity step of the update
(zero key, zero log-decay), so all memories run as one batched call of the chunked kernel over the whole sequence
with their writes masked: a memory's final state equals running the update on its routed subsequence alone.

Reading taken here (see docs/methods/mixture-of-memories.md): the short convolutions run over the full sequence
(the authors' code runs each memory's over its routed subsequence), there is no output gate, and the update rule is
decayed linear attention (the paper's default is Gated DeltaNet).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankwise.nn.mixture_of_memories.checks import check_mode, check_sequence, positive_int
from rankwise.nn.mixture_of_memories.kernels import linear_attention_chunked, linear_attention_step
from rankwise.nn.mixture_of_memories.linear_attention import KeyValue, LinearAttention, State, run_recurrent
from rankwise.nn.mixture_of_memories.router import Routing, TopKRouter


class MixtureOfMemories(LinearAttention):
    """MoM token mixer, a causal drop-in layer: x [batch, seq, d_model] -> [batch, seq, d_model].

    Args (besides `LinearAttention`'s d_model, num_heads, key_dim, value_dim, conv_size, decay, chunk_size):
        num_memories: M routed memories.  top_k: memories each token writes to and reads from (<= M).
        shared_memory: add one memory every token writes to and reads from without a routing weight.
    `forward(x, return_routing=True)` also returns the `Routing` (its logits feed `load_balancing_loss`).
    With M = 1, top_k = 1 and no shared memory the layer equals `LinearAttention` with the same weights. With
    top_k = 1 the routing weight is always 1, so the router learns from the load-balancing loss only.

    Layout: the memories' key / value projections are one `KeyValue` with (M + shared) * heads heads, memory-major
    (memory c, head h at c * heads + h; the shared memory last), so all memories run as one batched kernel call.
    """

    def __init__(self, d_model: int, num_heads: int = 2, key_dim: int | None = None, value_dim: int | None = None,
                 num_memories: int = 4, top_k: int = 2, shared_memory: bool = True, conv_size: int = 4,
                 decay: str | float | Sequence[float] | None = None, chunk_size: int | None = 64) -> None:
        super().__init__(d_model, num_heads, key_dim, value_dim, conv_size, decay, chunk_size)
        positive_int(num_memories, "num_memories")
        positive_int(top_k, "top_k")
        self.router = TopKRouter(d_model, num_memories, top_k)  # raises when top_k > num_memories
        self.num_memories, self.top_k, self.shared_memory = num_memories, top_k, bool(shared_memory)
        self.copies = num_memories + int(self.shared_memory)
        self.kv = KeyValue(d_model, self.copies * num_heads, self.key_dim, self.value_dim, conv_size)

    def _per_head(self, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
        """(write mask, read weight), both [..., copies * heads]: routed memories' entries, and the shared
        memory's (always written, weight 1), repeated over each memory's heads."""
        routed, weights = routing.routed.to(routing.weights.dtype), routing.weights
        if self.shared_memory:
            ones = weights.new_ones(*weights.shape[:-1], 1)
            routed, weights = torch.cat([routed, ones], -1), torch.cat([weights, ones], -1)
        return routed.repeat_interleave(self.num_heads, -1), weights.repeat_interleave(self.num_heads, -1)

    def forward(self, x: torch.Tensor, mode: str = "chunked",
                return_routing: bool = False) -> torch.Tensor | tuple[torch.Tensor, Routing]:
        """x [batch, seq, d_model] -> y [batch, seq, d_model] (and the `Routing` with return_routing)."""
        name = type(self).__name__
        check_sequence(x, self.d_model, name)
        if check_mode(mode, name) == "recurrent":
            y = run_recurrent(self, x)
            return (y, self.router(x)) if return_routing else y
        B, L = x.shape[:2]
        routing = self.router(x)
        write, read = (t.transpose(1, 2) for t in self._per_head(routing))  # [B, C*H, L]
        q = self.q(x).repeat(1, self.copies, 1, 1)  # the shared query, once per memory: [B, C*H, L, dk]
        k, v = self.kv(x)
        log_decay = self._log_decay(x, B, L)
        if log_decay is not None:
            log_decay = log_decay.repeat(1, self.copies, 1) * write  # a non-routed step does not decay
        o, _ = linear_attention_chunked(q, k * write.unsqueeze(-1), v, log_decay, self.chunk_size)
        o = (o * read.unsqueeze(-1)).unflatten(1, (self.copies, self.num_heads)).sum(1)  # [B, H, L, dv]
        y = self.readout(o)
        return (y, routing) if return_routing else y

    def init_state(self, batch: int, like: torch.Tensor) -> State:
        """Conv caches of q, k, v and the memories S [batch, copies * heads, dk, dv]."""
        return {"q": self.q.init_cache(batch, like), "k": self.kv.k.init_cache(batch, like),
                "v": self.kv.v.init_cache(batch, like),
                "S": like.new_zeros(batch, self.copies * self.num_heads, self.key_dim, self.value_dim)}

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One token: x_t [batch, d_model] -> (y_t [batch, d_model], new state)."""
        q_t, cq = self.q.step(x_t, state["q"])
        k_t, ck = self.kv.k.step(x_t, state["k"])
        v_t, cv = self.kv.v.step(x_t, state["v"])
        write, read = self._per_head(self.router(x_t))  # [B, C*H]
        a_t = self._log_decay(x_t, x_t.shape[0], 1)
        a_t = None if a_t is None else a_t[..., 0].repeat(1, self.copies) * write
        o_t, S = linear_attention_step(q_t.repeat(1, self.copies, 1), k_t * write.unsqueeze(-1), v_t, a_t, state["S"])
        o_t = (o_t * read.unsqueeze(-1)).unflatten(1, (self.copies, self.num_heads)).sum(1)
        return self.readout.step(o_t), {"q": cq, "k": ck, "v": cv, "S": S}


__all__ = ["MixtureOfMemories"]
