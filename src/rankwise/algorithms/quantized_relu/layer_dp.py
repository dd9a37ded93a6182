"""Exact d-QNNT for layered architectures: a dynamic programme over reachable activation multisets.

The fixed-parameter idea of the paper (FPT in alpha + width, Cor. 1 / 2), for layered fully connected networks:

- Collapse the data onto its p <= d^alpha distinct inputs (`deduplicate`); a neuron is then an activation vector in
  Z_d^p (its value on every distinct input), and a layer is the *multiset* of its neurons' vectors. Order does not
  matter (the next layer is fully connected, so a permutation of a layer is undone by permuting weights), and
  multiplicity does (two copies of a vector give the next layer coefficients w + w').
- From a layer state S (w neurons) one next-layer neuron can realise the set A(S) = {ReLU_d(sum_j w_j a_j - b)} over
  its d^w in-weights and d biases, deduplicated. The next states are the multisets of size w' drawn from A(S).
  Breadth-first over reachable states only, layer by layer, with back-pointers.
- The output layer picks omega neurons from A(S) of each last state jointly (a point is wrong if any coordinate is);
  the minimum over states of `n - sum_x count(x, out(x))` is the optimum, and the back-pointers rebuild the weights.

The state count is bounded by a function of (d, p, widths) alone, so after the O(n) deduplication the running time
is f(d, alpha, widths, omega) * O(n): linear in the number of samples and in depth (once the reachable states
saturate), exponential in alpha (through p) and in width. This is a reconstruction for layered architectures (the
card's "implementable algorithm 4"), not the paper's tree-decomposition DP for general DAGs.

Instances whose worst-case state count exceeds the limits are refused before any work (`estimate_dp_work`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.quantized_relu.brute_force import Solution
from rankwise.algorithms.quantized_relu.dataset import DistinctData, deduplicate
from rankwise.algorithms.quantized_relu.network import QuantizedArchitecture, QuantizedNetwork, relu_d, z_d
from rankwise.errors import InvalidInputError

MAX_CANDIDATES = 3_000_000  # worst-case candidate layer states the Python-level search may enumerate
MAX_EVALUATIONS = 2_000_000_000  # worst-case neuron evaluations (one neuron on one distinct input) in numpy
OUTPUT_CHUNK = 1 << 12


@dataclass(frozen=True)
class DPWork:
    """Worst-case size of the search, known before it runs: per-layer state bounds, candidates, evaluations."""

    p: int
    state_bounds: tuple[int, ...]
    candidates: int
    evaluations: int


def _multisets(m: int, k: int) -> int:
    return math.comb(m + k - 1, k)


def _weight_vectors(fan_in: int, d: int, max_nonzero: int | None) -> np.ndarray:
    """All in-weight vectors [K, fan_in] over Z_d, optionally with at most `max_nonzero` non-zero entries."""
    values = z_d(d)
    grid = np.array(list(itertools.product(values, repeat=fan_in)), dtype=np.int64).reshape(-1, fan_in)
    if max_nonzero is not None:
        grid = grid[np.count_nonzero(grid, axis=1) <= max_nonzero]
    return grid


def estimate_dp_work(arch: QuantizedArchitecture, p: int) -> DPWork:
    """Upper bounds on the DP's states and work for `arch` on p distinct inputs (no search is run)."""
    d = arch.d
    vectors = (arch.top + 1) ** p if arch.clip else math.inf  # activation vectors a layer's neuron can take
    states, bounds, candidates, evaluations = 1, [], 0, 0
    fan_in = arch.inputs
    for width in arch.hidden:
        options = min(d ** (fan_in + 1), vectors)
        evaluations += states * d ** (fan_in + 1) * p
        cand = states * _multisets(options, width)
        candidates += cand
        states = min(cand, _multisets(vectors, width)) if arch.clip else cand
        bounds.append(int(states))
        fan_in = width
    options = min(d ** (fan_in + 1), vectors)
    evaluations += states * (d ** (fan_in + 1) + options ** arch.outputs * arch.outputs) * p
    return DPWork(p, tuple(bounds), int(candidates), int(evaluations))


class _VectorTable:
    """Interning of activation vectors of one layer: id <-> vector."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}
        self.vectors: list[np.ndarray] = []

    def intern(self, v: np.ndarray) -> int:
        key = v.tobytes()
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.vectors)
            self.vectors.append(v)
        return i

    def matrix(self, state: tuple[int, ...]) -> np.ndarray:
        return np.stack([self.vectors[i] for i in state])


def _options(m: np.ndarray, arch: QuantizedArchitecture, weights: np.ndarray, biases: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct activation vectors [k, p] one neuron can realise on layer matrix m [w, p], with one (weights [k, w],
    bias [k]) realising each."""
    pre = weights @ m  # [K, p]
    signed = biases if arch.bias_sign == "subtract" else -biases
    acts = relu_d(pre[:, None, :] - signed[None, :, None], arch.d, arch.clip)  # [K, d, p]
    flat = acts.reshape(-1, m.shape[1])
    uniq, first = np.unique(flat, axis=0, return_index=True)
    return uniq, weights[first // biases.size], biases[first % biases.size]


def layer_dp(arch: QuantizedArchitecture, x: np.ndarray, y: np.ndarray, *, max_nonzero_in: int | None = None,
             max_candidates: int = MAX_CANDIDATES, max_evaluations: int = MAX_EVALUATIONS,
             early_stop: bool = True, data: DistinctData | None = None) -> Solution:
    """Minimal-error Z_d network of layered architecture `arch` on points x [n, alpha], labels y [n, omega].

    `max_nonzero_in` restricts every neuron to at most that many non-zero in-weights (the Lemma 1 operation); None
    is the unrestricted problem. `early_stop` ends the output phase once the label-count floor (no network can do
    better) is reached; False searches every last-layer state (the worst case, for stable timings). Refuses up front
    (InvalidInputError naming the limit) when the worst-case search is larger than `max_candidates` layer states or
    `max_evaluations` neuron evaluations.
    """
    if max_nonzero_in is not None and (not isinstance(max_nonzero_in, int) or max_nonzero_in < 0):
        raise InvalidInputError(f"max_nonzero_in must be None or an integer >= 0, got {max_nonzero_in!r}")
    data = deduplicate(arch, x, y) if data is None else data
    work = estimate_dp_work(arch, data.p)
    if work.candidates > max_candidates:
        raise InvalidInputError(
            f"instance too large for exact solving: up to {work.candidates:,} candidate layer states (p = {data.p} "
            f"distinct inputs, widths {arch.widths}, d = {arch.d}) exceed the limit max_candidates = "
            f"{max_candidates:,}; shrink alpha or the hidden widths, or raise the limit")
    if work.evaluations > max_evaluations:
        raise InvalidInputError(
            f"instance too large for exact solving: up to {work.evaluations:,} neuron evaluations (p = {data.p}, "
            f"widths {arch.widths}, d = {arch.d}) exceed the limit max_evaluations = {max_evaluations:,}")
    biases = z_d(arch.d)
    ops = 0
    # Layer 0 is the input layer, one fixed state: its neurons are the alpha input coordinates.
    m0 = data.inputs.T.copy()  # [alpha, p]
    parents: list[dict[tuple[int, ...], tuple[tuple[int, ...] | None, list[tuple[np.ndarray, int]]]]] = []
    tables: list[_VectorTable] = []
    current: dict[tuple[int, ...], np.ndarray] = {(): m0}  # state key -> its matrix [w, p]
    fan_in = arch.inputs
    states_per_layer, candidates_seen = [], 0
    for width in arch.hidden:
        weights = _weight_vectors(fan_in, arch.d, max_nonzero_in)
        table, back = _VectorTable(), {}
        for key, m in current.items():
            vecs, ws, bs = _options(m, arch, weights, biases)
            ops += weights.shape[0] * biases.size * data.p
            ids = [table.intern(v) for v in vecs]
            realise = {i: (w, int(b)) for i, w, b in zip(ids, ws, bs)}
            for combo in itertools.combinations_with_replacement(sorted(ids), width):
                candidates_seen += 1
                if combo not in back:
                    back[combo] = (key if parents else None, [realise[i] for i in combo])
        parents.append(back)
        tables.append(table)
        current = {key: table.matrix(key) for key in back}
        states_per_layer.append(len(current))
        fan_in = width
    # Output layer: omega neurons chosen jointly from A(S) for every last state S.
    weights = _weight_vectors(fan_in, arch.d, max_nonzero_in)
    floor = data.lower_bound()
    best: tuple[int, tuple[int, ...], list[tuple[np.ndarray, int]]] | None = None
    for key, m in current.items():
        vecs, ws, bs = _options(m, arch, weights, biases)
        ops += weights.shape[0] * biases.size * data.p
        err, choice = _best_output_tuple(vecs, data, arch.outputs)
        ops += vecs.shape[0] ** arch.outputs * arch.outputs * data.p
        if best is None or err < best[0]:
            best = (err, key, [(ws[c], int(bs[c])) for c in choice])
            if early_stop and err <= floor:  # no network does better than the label-count floor
                break
    assert best is not None
    network = _rebuild(arch, parents, best[1], best[2])
    return Solution(best[0], network, data.p, ops, {"states_per_layer": states_per_layer,
                                                     "candidates": candidates_seen, "work_bound": work})


def _best_output_tuple(vecs: np.ndarray, data: DistinctData, omega: int) -> tuple[int, tuple[int, ...]]:
    """The omega-tuple of option vectors (rows of vecs [k, p]) with the fewest wrong points; first in product order."""
    k = vecs.shape[0]
    if omega == 1:
        err = data.errors(vecs[:, :, None])
        c = int(np.argmin(err))
        return int(err[c]), (c,)
    best_err, best_idx = None, 0
    total = k ** omega
    radix = k ** np.arange(omega - 1, -1, -1, dtype=np.int64)
    for start in range(0, total, OUTPUT_CHUNK):
        idx = np.arange(start, min(start + OUTPUT_CHUNK, total), dtype=np.int64)
        choice = (idx[:, None] // radix[None, :]) % k  # [B, omega]
        outputs = np.moveaxis(vecs[choice], 1, 2)  # [B, omega, p] -> [B, p, omega]
        err = data.errors(outputs)
        j = int(np.argmin(err))
        if best_err is None or err[j] < best_err:
            best_err, best_idx = int(err[j]), start + j
    return int(best_err), tuple(int(v) for v in (best_idx // radix) % k)


def _rebuild(arch: QuantizedArchitecture, parents, last_key: tuple[int, ...],
             outputs: list[tuple[np.ndarray, int]]) -> QuantizedNetwork:
    """Weights [out, in] and biases from the back-pointers; neuron order in a hidden layer = its state's order."""
    layers = [outputs]
    key = last_key
    for back in reversed(parents):
        parent, neurons = back[key]
        layers.append(neurons)
        key = parent
    layers.reverse()
    weights = [np.stack([w for w, _ in layer]) for layer in layers]
    biases = [np.array([b for _, b in layer], dtype=np.int64) for layer in layers]
    return QuantizedNetwork(arch, weights, biases)


def decide(arch: QuantizedArchitecture, x: np.ndarray, y: np.ndarray, max_errors: int, **kwargs) -> bool:
    """The decision problem d-QNNT: is there a Z_d network with at most `max_errors` wrong points?"""
    if not isinstance(max_errors, (int, np.integer)) or max_errors < 0:
        raise InvalidInputError(f"max_errors must be an integer >= 0, got {max_errors!r}")
    return layer_dp(arch, x, y, **kwargs).errors <= max_errors


def smallest_sufficient_in_degree(arch: QuantizedArchitecture, x: np.ndarray, y: np.ndarray, **kwargs
                                  ) -> tuple[int, Solution]:
    """Lemma 1 check: the least Delta such that at most Delta non-zero in-weights per neuron still reach the optimum."""
    data = deduplicate(arch, x, y)
    optimum = layer_dp(arch, x, y, data=data, **kwargs)
    for delta in range(max(arch.widths[:-1]) + 1):
        sol = layer_dp(arch, x, y, max_nonzero_in=delta, data=data, **kwargs)
        if sol.errors == optimum.errors:
            return delta, sol
    return max(arch.widths[:-1]), optimum
