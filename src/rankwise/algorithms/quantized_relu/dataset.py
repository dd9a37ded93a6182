"""Deduplicated training data and random instances for d-QNNT.

Deduplication is why the input dimension alpha, not the number of samples, controls the cost of exact training: a
dataset of n points over Z_d^alpha has at most p <= d^alpha distinct inputs, and the error of any network is

    error = n - sum_x count(x, out(x)),

a function of the p distinct inputs and a per-input table of label counts. Every later computation sees p, not n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.quantized_relu.network import (
    QuantizedArchitecture, QuantizedNetwork, check_inputs, check_labels, z_d,
)
from rankwise.errors import InvalidInputError

MAX_LABEL_CODES = 1 << 20  # d^omega label tuples are tabulated densely per distinct input


@dataclass(frozen=True)
class DistinctData:
    """A dataset collapsed onto its distinct inputs.

    inputs: [p, alpha] distinct input rows (sorted); counts: [p, d^omega] number of points with that input and that
    label tuple (label tuples coded by `label_code`); n: the number of points.
    """

    arch: QuantizedArchitecture
    inputs: np.ndarray
    counts: np.ndarray
    n: int

    @property
    def p(self) -> int:
        return int(self.inputs.shape[0])

    def label_code(self, outputs: np.ndarray) -> np.ndarray:
        """Codes [..., p] of output tuples [..., p, omega]; -1 where a value is outside Z_d (never a label)."""
        values = z_d(self.arch.d)
        shifted = np.asarray(outputs, dtype=np.int64) - values[0]
        radix = self.arch.d ** np.arange(self.arch.outputs, dtype=np.int64)
        code = shifted @ radix
        outside = np.any((shifted < 0) | (shifted >= self.arch.d), axis=-1)
        return np.where(outside, -1, code)

    def correct(self, outputs: np.ndarray) -> np.ndarray:
        """Number of correctly labelled points [...] for per-distinct-input outputs [..., p, omega]."""
        code = self.label_code(outputs)
        rows = np.arange(self.p)
        hit = self.counts[rows, np.maximum(code, 0)]
        return np.where(code >= 0, hit, 0).sum(axis=-1)

    def errors(self, outputs: np.ndarray) -> np.ndarray:
        """Error counts [...] for per-distinct-input outputs [..., p, omega]."""
        return self.n - self.correct(outputs)

    def lower_bound(self) -> int:
        """Points no network can get right: those whose label is not their input's most frequent label tuple."""
        return int(self.n - self.counts.max(axis=1).sum())


def deduplicate(arch: QuantizedArchitecture, x: np.ndarray, y: np.ndarray) -> DistinctData:
    """Collapse points x [n, alpha], labels y [n, omega] (values in Z_d) onto their distinct inputs."""
    xs = check_inputs(x, arch)
    if xs.shape[0] == 0:
        raise InvalidInputError("the dataset is empty: d-QNNT needs at least one data point")
    ys = check_labels(y, arch, xs.shape[0])
    codes_total = arch.d ** arch.outputs
    if codes_total > MAX_LABEL_CODES:
        raise InvalidInputError(f"d^omega = {codes_total} label tuples exceed the table limit {MAX_LABEL_CODES}")
    inputs, inverse = _unique_rows(xs, arch.d)
    tmp = DistinctData(arch, inputs, np.zeros((inputs.shape[0], 1), dtype=np.int64), xs.shape[0])
    label = tmp.label_code(ys)
    counts = np.zeros((inputs.shape[0], codes_total), dtype=np.int64)
    np.add.at(counts, (inverse, label), 1)
    return DistinctData(arch, inputs, counts, int(xs.shape[0]))


def _unique_rows(xs: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows (lexicographic order) and each row's index among them; rows are coded as one integer when
    d^alpha fits in int64 (a 1-D sort is ~10x faster than np.unique(axis=0))."""
    alpha = xs.shape[1]
    if alpha * math.log2(d) >= 62:
        inputs, inverse = np.unique(xs, axis=0, return_inverse=True)
        return inputs, inverse.ravel()
    radix = d ** np.arange(alpha - 1, -1, -1, dtype=np.int64)
    lo = int(z_d(d)[0])
    codes, first, inverse = np.unique((xs - lo) @ radix, return_index=True, return_inverse=True)
    return xs[first], inverse.ravel()


def random_network(arch: QuantizedArchitecture, rng: np.random.Generator) -> QuantizedNetwork:
    """Every weight and bias drawn uniformly from Z_d."""
    values = z_d(arch.d)
    weights = [rng.choice(values, size=(o, i)) for o, i in arch.layer_shapes]
    biases = [rng.choice(values, size=o) for o, _ in arch.layer_shapes]
    return QuantizedNetwork(arch, weights, biases)


def random_inputs(arch: QuantizedArchitecture, n: int, rng: np.random.Generator) -> np.ndarray:
    """n inputs drawn uniformly from Z_d^alpha (with duplicates): [n, alpha]."""
    return rng.choice(z_d(arch.d), size=(int(n), arch.inputs))


def planted_instance(arch: QuantizedArchitecture, n: int, rng: np.random.Generator, flips: int = 0
                     ) -> tuple[QuantizedNetwork, np.ndarray, np.ndarray]:
    """(teacher, x [n, alpha], y [n, omega]): a random Z_d teacher labels random inputs; `flips` points get a random
    other label afterwards, so the optimum is at most `flips` (and 0 when `flips` = 0)."""
    teacher = random_network(arch, rng)
    x = random_inputs(arch, n, rng)
    y = teacher.forward(x)
    if flips:
        values = z_d(arch.d)
        for i in rng.choice(int(n), size=min(int(flips), int(n)), replace=False):
            c = rng.integers(arch.outputs)
            y[i, c] = rng.choice(values[values != y[i, c]])
    return teacher, x, y


def random_labels_instance(arch: QuantizedArchitecture, n: int, rng: np.random.Generator
                           ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with labels drawn uniformly from the values ReLU_d can output, so the optimum is usually > 0."""
    x = random_inputs(arch, n, rng)
    y = rng.integers(0, arch.top + 1, size=(int(n), arch.outputs))
    return x, y
