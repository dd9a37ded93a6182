"""The configuration space of a quantized model: per adapted linear layer one option (b0, b1, b2, B0, B1).

b0: NormalFloat weight bits; b1: bits of the double-quantized block scales; b2: dtype of the second-level scales
("bf16", "fp16", "fp32"); B0: weights per block; B1: block scales per second-level scale. A configuration is a
tuple of N options, one per layer in the model's module order; as an integer vector it is the 5N knob indices
(the search's view). Storage is QLoRA's formula b0 + b1/B0 + b2/(B0 B1) bits per weight (`rankwise.quant.codebook`),
and a configuration's budget is its average over all quantized weights (layers weighted by their size).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rankwise.adapters.coa_lora import KNOBS, SUPPORTED_BITS, SUPPORTED_BLOCKS, SUPPORTED_SCALE_BITS, SUPPORTED_SCALE_BLOCKS, SUPPORTED_SCALE_DTYPES
from rankwise.errors import InvalidInputError
from rankwise.quant.codebook import CodebookRecipe

Option = tuple  # (b0, b1, b2, B0, B1)
Configuration = tuple  # tuple[Option, ...], one per layer
SUPPORTED = (SUPPORTED_BITS, SUPPORTED_SCALE_BITS, SUPPORTED_SCALE_DTYPES, SUPPORTED_BLOCKS, SUPPORTED_SCALE_BLOCKS)


def recipe_of(option: Option) -> CodebookRecipe:
    """The codebook recipe of one option: NF-b0 in blocks of B0, scales double-quantized at b1 bits over B1."""
    b0, b1, b2, B0, B1 = option
    return CodebookRecipe("nf", int(b0), int(B0), scale_bits=int(b1), scale_block_size=int(B1), scale_dtype=str(b2))


@dataclass(frozen=True)
class ConfigSpace:
    """Layers (names, weights per layer) and the allowed values of each knob (KNOBS order)."""

    layers: tuple[str, ...]
    sizes: tuple[int, ...]
    choices: tuple[tuple, ...]

    def __post_init__(self) -> None:
        if not self.layers or len(self.layers) != len(self.sizes):
            raise InvalidInputError(f"a configuration space needs >= 1 layer and one size per layer, got {len(self.layers)} "
                                    f"layers and {len(self.sizes)} sizes")
        if len(self.choices) != len(KNOBS):
            raise InvalidInputError(f"give the allowed values of the {len(KNOBS)} knobs {KNOBS}, got {len(self.choices)}")
        for knob, values, supported in zip(KNOBS, self.choices, SUPPORTED):
            bad = [v for v in values if v not in supported or isinstance(v, bool)]
            if not values or bad or len(set(values)) != len(values):
                raise InvalidInputError(f"{knob} choices must be distinct values from {list(supported)}, got {list(values)}")

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def options(self) -> tuple[Option, ...]:
        """Every per-layer option, in knob-index order (the last knob varies fastest)."""
        return tuple(itertools.product(*self.choices))

    @cached_property
    def option_bits(self) -> np.ndarray:
        """Storage bits per weight of each option, float64 [K]."""
        return np.array([recipe_of(o).bits_per_weight() for o in self.options])

    @property
    def cardinalities(self) -> np.ndarray:
        """Values per dimension of the integer view, int64 [5N]."""
        return np.tile(np.array([len(c) for c in self.choices]), self.n_layers)

    def check_option(self, option: Sequence, where: str = "option") -> Option:
        if not isinstance(option, (list, tuple)) or len(option) != len(KNOBS):
            raise InvalidInputError(f"{where}: a layer option is {len(KNOBS)} values {KNOBS}, got {option!r}")
        for knob, value, allowed in zip(KNOBS, option, self.choices):
            if value not in allowed or isinstance(value, bool):
                raise InvalidInputError(f"{where}: {knob}={value!r} is outside this space's choices {knob} in {list(allowed)}")
        return tuple(option)

    def check(self, config: Sequence) -> Configuration:
        """A valid configuration (tuple of N options) or InvalidInputError saying what is wrong."""
        if not isinstance(config, (list, tuple)) or len(config) != self.n_layers:
            got = len(config) if isinstance(config, (list, tuple)) else type(config).__name__
            raise InvalidInputError(f"a configuration has one option per quantized layer ({self.n_layers}), got {got}")
        return tuple(self.check_option(o, f"layer {i} ({self.layers[i]})") for i, o in enumerate(config))

    def uniform(self, option: Sequence) -> Configuration:
        """The same option on every layer."""
        return (self.check_option(option),) * self.n_layers

    def option_index(self, option: Option) -> int:
        return self.options.index(tuple(option))

    def average_bits(self, config: Sequence) -> float:
        """Storage bits per weight of the configuration, averaged over all quantized weights."""
        config = self.check(config)
        n = np.asarray(self.sizes, dtype=np.float64)
        bits = np.array([self.option_bits[self.option_index(o)] for o in config])
        return float(n @ bits / n.sum())

    def to_vector(self, config: Sequence) -> list[int]:
        """Configuration -> its 5N knob indices."""
        return [c.index(v) for o in self.check(config) for c, v in zip(self.choices, o)]

    def from_vector(self, vector: Sequence[int]) -> Configuration:
        """5N knob indices -> configuration (InvalidInputError for a wrong length or an index out of range)."""
        v = [int(x) for x in vector]
        if len(v) != len(KNOBS) * self.n_layers:
            raise InvalidInputError(f"a configuration vector has {len(KNOBS)} indices per layer ({len(KNOBS) * self.n_layers}), got {len(v)}")
        cards = self.cardinalities
        if any(not 0 <= x < c for x, c in zip(v, cards)):
            raise InvalidInputError(f"configuration vector indices must satisfy 0 <= x_j < n_j ({cards.tolist()}), got {v}")
        return tuple(tuple(c[x] for c, x in zip(self.choices, v[i * 5 : i * 5 + 5])) for i in range(self.n_layers))

    def from_option_indices(self, indices: Sequence[int]) -> Configuration:
        """One option index (into `options`) per layer -> configuration."""
        return tuple(self.options[int(k)] for k in indices)

    def random(self, rng: np.random.Generator) -> Configuration:
        """Every knob of every layer drawn uniformly and independently."""
        return self.from_vector([int(rng.integers(c)) for c in self.cardinalities])
