"""Low-tubal-rank tensors under the t-product, and their recovery by factorised gradient descent (Liu et al., ICLR
2026: small initialisation + early stopping gives an error that does not grow with the over-estimated rank R).

    from rankwise.algorithms.tubal import (GaussianMeasurements, factorized_gd, low_tubal_rank_psd, small_init,
                                           spectral_init, t_product, t_svd, tubal_rank)
    x_star = low_tubal_rank_psd(30, 3, 3, seed=0)                       # X * X^T, ||X*|| = 1
    ops = GaussianMeasurements.draw(1350, (30, 30, 3), seed=0)
    train, val = ops.split(135)
    y = ops(x_star) + noise
    res = factorized_gd(train, y[:-135], small_init(30, 12, 3, 1e-10), step=0.1, iterations=3000,
                        validation=(val, y[-135:]), truth=x_star)
    res.estimate, res.es_step, res.es_rse
"""

from rankwise.algorithms.tubal.fgd import FGDResult, factorized_gd, fgd_gradient, fgd_objective, gram_from_factor
from rankwise.algorithms.tubal.init import small_init, spectral_init
from rankwise.algorithms.tubal.instances import low_tubal_rank_psd
from rankwise.algorithms.tubal.measurements import GaussianMeasurements
from rankwise.algorithms.tubal.tproduct import (
    block_circulant, fold_slices, from_fourier, symmetrize, t_identity, t_product, t_transpose, to_fourier,
    unfold_slices,
)
from rankwise.algorithms.tubal.tsvd import (
    fourier_singular_values, t_condition_number, t_frobenius_norm, t_spectral_norm, t_svd, tubal_rank,
)

__all__ = [
    "t_product", "t_transpose", "t_identity", "symmetrize", "to_fourier", "from_fourier", "block_circulant",
    "unfold_slices", "fold_slices", "t_svd", "tubal_rank", "fourier_singular_values", "t_spectral_norm",
    "t_frobenius_norm", "t_condition_number", "GaussianMeasurements", "low_tubal_rank_psd", "small_init",
    "spectral_init", "factorized_gd", "fgd_objective", "fgd_gradient", "gram_from_factor", "FGDResult",
]
