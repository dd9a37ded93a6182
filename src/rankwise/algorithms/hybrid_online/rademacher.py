"""Monte-Carlo Rademacher complexities of finite classes, for the regret bound's curve.

rad_T(F) = E_x E_sigma sup_f (1/T) sum_t sigma_t f(x_t). A class is given by its values on the atoms of a partition
of the domain on which every member is constant (e.g. the cells of a threshold grid), and a sample by the atom of
each point, so one draw of sigma costs one [K, atoms] product.
"""

from __future__ import annotations

import numpy as np

from rankwise.errors import InvalidInputError


def empirical_rademacher(values_on_atoms, atom_of_point, draws: int, rng: np.random.Generator) -> float:
    """E_sigma sup_f (1/T) sum_t sigma_t f(x_t) on one sample, by `draws` Rademacher draws.

    values_on_atoms: [K, k] member values on the k atoms. atom_of_point: [T] ints in [0, k).
    """
    v = np.asarray(values_on_atoms, dtype=np.float64)
    a = np.asarray(atom_of_point)
    if v.ndim != 2 or v.shape[0] == 0:
        raise InvalidInputError(f"values_on_atoms must be a non-empty [K, k] matrix, got shape {v.shape}")
    if a.ndim != 1 or a.size == 0 or a.min() < 0 or a.max() >= v.shape[1]:
        raise InvalidInputError(f"atom_of_point must be [T] (T >= 1) ints in [0, {v.shape[1]})")
    if not isinstance(draws, int) or draws < 1:
        raise InvalidInputError(f"draws must be a positive int, got {draws!r}")
    sigma = rng.choice((-1.0, 1.0), size=(draws, a.size))
    per_atom = np.stack([np.bincount(a, weights=s, minlength=v.shape[1]) for s in sigma])  # [draws, k]
    return float((v @ per_atom.T).max(axis=0).mean() / a.size)


def regret_bound(T: int, rad_composite: float, rad_h: float, lipschitz: float, delta: float = 0.05) -> float:
    """Theorem 1.1's bound with every O(.) constant read as 1 (the card's 'theoretical curve'):
    T rad_T(l o (H x R)) + L T rad_T(H) + L sqrt(T log(T / delta))."""
    return T * rad_composite + lipschitz * T * rad_h + lipschitz * float(np.sqrt(T * np.log(T / delta)))
