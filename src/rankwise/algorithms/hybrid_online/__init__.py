"""Oracle-efficient hybrid online learning with constrained adversaries (Okoroafor, Kleinberg, Kim; ICLR 2026):
x_t i.i.d. from D, labels from an adversary restricted to a known class R; FTRL with the truncated entropy
v log(v + 1) over conv(H), reduced to a linear (ERM) oracle by Frank-Wolfe; FTL and FTPL baselines; the stochastic
zero-sum-game corollary against `scipy.optimize.linprog`.

    import numpy as np
    from rankwise.algorithms.hybrid_online import (BestResponseAdversary, HybridFTRL, StumpOracle, play, regret,
                                                   threshold_class)
    grid = np.linspace(0, 1, 201)
    oracle = StumpOracle([grid], signs=(1,))                  # H = thresholds 1{x >= theta}, exact oracle
    rng = np.random.default_rng(0)
    adversary = BestResponseAdversary(threshold_class(grid), rng.beta(2, 5, 1000)[:, None])
    learner = HybridFTRL(oracle, "absolute", horizon=800)     # eta = sqrt(T / log T), Frank-Wolfe <= 50 calls/round
    run = play(learner, adversary, lambda g: g.beta(2, 5, 1), 800, rng)
    regret(run, oracle)                                       # vs the best fixed threshold in hindsight
"""

from rankwise.algorithms.hybrid_online.adversaries import (
    AlternatingAdversary, BestResponseAdversary, FixedAdversary, RandomAdversary,
)
from rankwise.algorithms.hybrid_online.frank_wolfe import FWResult, frank_wolfe, objective
from rankwise.algorithms.hybrid_online.game import GameSolution, LearnedGame, learn_game, matrix_game, payoff_matrix
from rankwise.algorithms.hybrid_online.hypotheses import (
    Constant, Interval, Mixture, Stump, as_points, class_values, interval_class, threshold_class,
)
from rankwise.algorithms.hybrid_online.learners import (
    EmpiricalLearner, FollowPerturbedLeader, FollowTheLeader, HybridFTRL, default_eta,
)
from rankwise.algorithms.hybrid_online.losses import ABSOLUTE, SQUARED, Loss, get_loss
from rankwise.algorithms.hybrid_online.oracles import (
    FiniteClassOracle, LinearOracle, OracleError, SklearnERMOracle, StumpOracle, call_oracle, linear_objective,
    oracle_excess,
)
from rankwise.algorithms.hybrid_online.protocol import Play, best_fixed_loss, play, regret
from rankwise.algorithms.hybrid_online.rademacher import empirical_rademacher, regret_bound
from rankwise.algorithms.hybrid_online.regularizer import psi, psi_grad, psi_hess

__all__ = [
    "HybridFTRL", "FollowTheLeader", "FollowPerturbedLeader", "EmpiricalLearner", "default_eta", "LinearOracle",
    "FiniteClassOracle", "StumpOracle", "SklearnERMOracle", "OracleError", "call_oracle", "linear_objective",
    "oracle_excess", "Stump", "Interval", "Constant", "Mixture", "threshold_class", "interval_class", "class_values",
    "as_points", "FixedAdversary", "AlternatingAdversary", "RandomAdversary", "BestResponseAdversary", "Play", "play",
    "regret", "best_fixed_loss", "frank_wolfe", "objective", "FWResult", "matrix_game", "payoff_matrix", "learn_game",
    "GameSolution", "LearnedGame", "empirical_rademacher", "regret_bound", "psi", "psi_grad", "psi_hess", "Loss",
    "ABSOLUTE", "SQUARED", "get_loss",
]
