"""Fully quantized ReLU networks over Z_d: the architecture, the network, its forward pass and the verifier.

Conventions (the paper's d-QNNT, card quantized-relu-training.md):

- Z_d = {-floor((d-1)/2), ..., ceil((d-1)/2)}: d consecutive integers (Z_2 = {0, 1}, Z_3 = {-1, 0, 1}).
- A neuron computes f(v) = ReLU_d(sum_u f(u) w(uv) - b(v)): the bias is *subtracted* (`bias_sign="subtract"`).
- ReLU_d is ReLU clipped into Z_d, i.e. min(max(0, z), ceil((d-1)/2)) (`clip=True`); output neurons apply it too.
- A data point is wrong when any output coordinate differs from its label; the error is the count of wrong points.

Weights are [out, in] integer arrays, as torch stores layers. Everything here is exact integer arithmetic (int64).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankwise.errors import InvalidInputError

BIAS_SIGNS = ("subtract", "add")


def z_d(d: int) -> np.ndarray:
    """The d integers of Z_d in increasing order, e.g. z_d(3) = [-1, 0, 1]."""
    if not isinstance(d, (int, np.integer)) or d < 2:
        raise InvalidInputError(f"d must be an integer >= 2 (Z_d needs two values at least), got {d!r}")
    lo = -((d - 1) // 2)
    return np.arange(lo, lo + d, dtype=np.int64)


def relu_d(z: np.ndarray, d: int, clip: bool = True) -> np.ndarray:
    """ReLU_d(z) = min(max(0, z), ceil((d-1)/2)) elementwise (plain ReLU when `clip` is False); int64 out."""
    out = np.maximum(np.asarray(z, dtype=np.int64), 0)
    return np.minimum(out, int(z_d(d)[-1])) if clip else out


@dataclass(frozen=True)
class QuantizedArchitecture:
    """A layered fully connected architecture: `inputs` (alpha) -> `hidden` widths -> `outputs` (omega) over Z_d."""

    inputs: int
    hidden: tuple[int, ...]
    outputs: int
    d: int
    bias_sign: str = "subtract"
    clip: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(w) for w in self.hidden))
        for name, v in (("inputs", self.inputs), ("outputs", self.outputs)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
        if any(w < 1 for w in self.hidden):
            raise InvalidInputError(f"hidden widths must be positive, got {self.hidden}")
        z_d(self.d)  # validates d
        if self.bias_sign not in BIAS_SIGNS:
            raise InvalidInputError(f"bias_sign must be one of {BIAS_SIGNS}, got {self.bias_sign!r}")

    @property
    def widths(self) -> tuple[int, ...]:
        """(alpha, *hidden, omega)."""
        return (self.inputs, *self.hidden, self.outputs)

    @property
    def layer_shapes(self) -> list[tuple[int, int]]:
        """[out, in] of every layer's weight matrix."""
        w = self.widths
        return [(w[i + 1], w[i]) for i in range(len(w) - 1)]

    @property
    def n_params(self) -> int:
        """Number of weights plus biases, all of them free in Z_d (the certificate's length)."""
        return sum(o * i + o for o, i in self.layer_shapes)

    @property
    def top(self) -> int:
        """The largest value of Z_d, where ReLU_d clips."""
        return int(z_d(self.d)[-1])


def pre_activation(a: np.ndarray, weight: np.ndarray, bias: np.ndarray, bias_sign: str) -> np.ndarray:
    """a [..., n, in] times weight^T [in, out] minus (or plus) bias [out]: the integer pre-activations [..., n, out]."""
    z = a @ np.swapaxes(weight, -1, -2)
    b = bias[..., None, :]
    return z - b if bias_sign == "subtract" else z + b


@dataclass
class QuantizedNetwork:
    """An assignment of every weight ([out, in]) and bias ([out]) of `arch` from Z_d."""

    arch: QuantizedArchitecture
    weights: list[np.ndarray]
    biases: list[np.ndarray]
    _checked: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        shapes = self.arch.layer_shapes
        if len(self.weights) != len(shapes) or len(self.biases) != len(shapes):
            raise InvalidInputError(f"{len(shapes)} layers need {len(shapes)} weights and biases, got "
                                    f"{len(self.weights)} and {len(self.biases)}")
        values = z_d(self.arch.d)
        self.weights = [np.asarray(w, dtype=np.int64) for w in self.weights]
        self.biases = [np.asarray(b, dtype=np.int64) for b in self.biases]
        for k, ((o, i), w, b) in enumerate(zip(shapes, self.weights, self.biases)):
            if w.shape != (o, i) or b.shape != (o,):
                raise InvalidInputError(f"layer {k}: weight must be [{o}, {i}] and bias [{o}], got "
                                        f"{list(w.shape)} and {list(b.shape)}")
            entries = np.concatenate([w.ravel(), b])
            if entries.min() < values[0] or entries.max() > values[-1]:
                raise InvalidInputError(f"layer {k}: weights and biases must lie in Z_{self.arch.d} = "
                                        f"{values.tolist()}")

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Outputs [n, omega] for integer inputs x [n, alpha] (values in Z_d)."""
        a = check_inputs(x, self.arch)
        for w, b in zip(self.weights, self.biases):
            a = relu_d(pre_activation(a, w, b, self.arch.bias_sign), self.arch.d, self.arch.clip)
        return a

    def parameters(self) -> np.ndarray:
        """The certificate: every weight then bias, layer by layer, as one int64 vector of length `arch.n_params`."""
        return np.concatenate([np.concatenate([w.ravel(), b]) for w, b in zip(self.weights, self.biases)])


def network_from_parameters(arch: QuantizedArchitecture, params: np.ndarray) -> QuantizedNetwork:
    """Inverse of `QuantizedNetwork.parameters`."""
    params = np.asarray(params, dtype=np.int64).ravel()
    if params.size != arch.n_params:
        raise InvalidInputError(f"{arch.n_params} parameters expected, got {params.size}")
    weights, biases, k = [], [], 0
    for o, i in arch.layer_shapes:
        weights.append(params[k:k + o * i].reshape(o, i))
        k += o * i
        biases.append(params[k:k + o])
        k += o
    return QuantizedNetwork(arch, weights, biases)


def check_inputs(x: np.ndarray, arch: QuantizedArchitecture) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 2 or a.shape[1] != arch.inputs:
        raise InvalidInputError(f"inputs must be [n, {arch.inputs}], got shape {list(a.shape)}")
    if not np.issubdtype(a.dtype, np.integer):
        raise InvalidInputError(f"inputs must be integers in Z_{arch.d}, got dtype {a.dtype}")
    values = z_d(arch.d)
    if a.size and (a.min() < values[0] or a.max() > values[-1]):
        raise InvalidInputError(f"inputs must lie in Z_{arch.d} = {values.tolist()}")
    return a.astype(np.int64)


def check_labels(y: np.ndarray, arch: QuantizedArchitecture, n: int) -> np.ndarray:
    t = np.asarray(y)
    if t.ndim == 1 and arch.outputs == 1:
        t = t[:, None]
    if t.shape != (n, arch.outputs):
        raise InvalidInputError(f"labels must be [{n}, {arch.outputs}] (one row per input), got shape {list(t.shape)}")
    if not np.issubdtype(t.dtype, np.integer):
        raise InvalidInputError(f"labels must be integers in Z_{arch.d}, got dtype {t.dtype}")
    values = z_d(arch.d)
    if t.size and (t.min() < values[0] or t.max() > values[-1]):
        raise InvalidInputError(f"labels must lie in Z_{arch.d} = {values.tolist()}")
    return t.astype(np.int64)


def count_errors(net: QuantizedNetwork, x: np.ndarray, y: np.ndarray) -> int:
    """The verifier (the NP certificate check): the number of points whose output differs from the label anywhere."""
    out = net.forward(x)
    labels = check_labels(y, net.arch, out.shape[0])
    return int(np.any(out != labels, axis=1).sum())
