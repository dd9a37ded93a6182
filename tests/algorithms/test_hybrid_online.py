"""Hybrid online learning: the card's invariants, the oracle reduction against brute force, the game against
linprog, and the refusals."""

import math

import numpy as np
import pytest

from rankwise.algorithms.hybrid_online import (
    AlternatingAdversary, BestResponseAdversary, Constant, FiniteClassOracle, FixedAdversary, FollowPerturbedLeader,
    FollowTheLeader, HybridFTRL, LinearOracle, Mixture, OracleError, SklearnERMOracle, Stump, StumpOracle,
    best_fixed_loss, call_oracle, class_values, empirical_rademacher, frank_wolfe, interval_class, learn_game,
    linear_objective, matrix_game, objective, oracle_excess, payoff_matrix, play, psi, psi_grad, psi_hess, regret,
    threshold_class,
)
from rankwise.errors import InvalidInputError, RankwiseError

pytestmark = pytest.mark.method("hybrid-online-learning")

EPS = np.finfo(np.float64).eps
GRID = np.linspace(0, 1, 21)


def _beta(g):
    return g.beta(2.0, 5.0, 1)


def _stumps_2d(grid):
    return [Stump(f, float(t), s) for f in range(2) for t in grid for s in (1, -1)]


# ---- oracles: exact reductions vs brute force ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_threshold_oracle_equals_brute_force(seed):
    g = np.random.default_rng(seed)
    X, c = g.random((30, 1)), g.standard_normal(30)
    H = threshold_class(GRID)
    fast = call_oracle(StumpOracle([GRID], signs=(1,)), X, c)
    brute = call_oracle(FiniteClassOracle(H), X, c)
    # equal objective (ties between thresholds with no point in between give the same value)
    assert linear_objective(fast, X, c) == pytest.approx(linear_objective(brute, X, c), abs=64 * EPS * np.abs(c).sum())
    assert linear_objective(fast, X, c) == pytest.approx(float((class_values(H, X) @ c).min()), abs=64 * EPS * np.abs(c).sum())


@pytest.mark.parametrize("seed", range(5))
def test_stump_oracle_two_features_both_signs_equals_brute_force(seed):
    g = np.random.default_rng(10 + seed)
    X, c = g.random((25, 2)), g.standard_normal(25)
    grid = np.linspace(0, 1, 9)
    fast = call_oracle(StumpOracle([grid, grid]), X, c)
    best = float((class_values(_stumps_2d(grid), X) @ c).min())
    assert linear_objective(fast, X, c) == pytest.approx(best, abs=64 * EPS * np.abs(c).sum())


def test_sklearn_oracle_is_the_weighted_classification_reduction():
    g = np.random.default_rng(3)
    X = g.random((40, 2))
    # costs whose exact minimiser is a stump: negative (worth predicting 1) exactly where x0 >= 0.5
    c = np.where(X[:, 0] >= 0.5, -1.0, 1.0) * (0.5 + g.random(40))
    h = call_oracle(SklearnERMOracle(), X, c)
    # two orders of summing a subset of the 40 costs: within (n - 1) u sum|c| each, 64 eps sum|c| covers both
    assert linear_objective(h, X, c) == pytest.approx(c[c < 0].sum(), abs=64 * EPS * np.abs(c).sum())
    # in general it is approximate but never better than the exact oracle over all stumps on the data
    grids = [np.r_[np.unique(X[:, f]), np.inf] for f in range(2)]
    for s in range(5):
        c2 = np.random.default_rng(s).standard_normal(40)
        assert oracle_excess(SklearnERMOracle(), StumpOracle(grids), X, c2) >= -64 * EPS * np.abs(c2).sum()


def test_sklearn_oracle_with_logistic_regression_and_constant_cases():
    from sklearn.linear_model import LogisticRegression

    g = np.random.default_rng(4)
    X = g.standard_normal((50, 2))
    c = np.where(X[:, 0] + X[:, 1] > 0, -1.0, 1.0)
    h = call_oracle(SklearnERMOracle(lambda: LogisticRegression()), X, c)
    assert linear_objective(h, X, c) <= c[c < 0].sum() + 3  # at most a few points on the wrong side
    assert isinstance(call_oracle(SklearnERMOracle(), X, np.ones(50)), Constant)  # all costs positive: h = 0
    assert call_oracle(SklearnERMOracle(), X, -np.ones(50)).predict(X).tolist() == [1.0] * 50


# ---- the regulariser ------------------------------------------------------------------------------------------


def test_truncated_entropy_nonnegative_and_strongly_convex():
    v = np.linspace(0, 1, 1001)
    assert np.all(psi(v) >= 0) and psi(np.array([1.0]))[0] == pytest.approx(math.log(2))
    assert np.all(psi_hess(v) >= 0.75 - 4 * EPS)
    assert psi_hess(np.array([1.0]))[0] == pytest.approx(0.75)
    h = 1e-6  # derivatives by central differences: error <= h^2 |f'''| / 6 + (rounding of f and of v +- h) / h
    # on [0, 1]: |psi|, |psi'| <= 1.2 (rounding part <= 2 eps / h) and |psi'''| <= 3, |psi''''| <= 8 (truncation)
    fd_bound = 2 * h**2 + 8 * EPS / h
    num = (psi(v[1:-1] + h) - psi(v[1:-1] - h)) / (2 * h)
    assert np.max(np.abs(num - psi_grad(v[1:-1]))) < fd_bound
    num2 = (psi_grad(v[1:-1] + h) - psi_grad(v[1:-1] - h)) / (2 * h)
    assert np.max(np.abs(num2 - psi_hess(v[1:-1]))) < fd_bound


# ---- Frank-Wolfe ----------------------------------------------------------------------------------------------


def test_frank_wolfe_matches_grid_search_over_mixtures_on_a_3_point_toy():
    # 3 points, H = 4 thresholds: conv(H) = monotone staircase mixtures; search a fine simplex grid directly
    X = np.array([[0.1], [0.5], [0.9]])
    H = threshold_class([0.0, 0.3, 0.7, 1.0 + 1e-9])
    V = class_values(H, X)  # [4, 3]
    A, B, lam = np.array([0.3, 0.0, 0.5]), np.array([-0.8, 0.4, -0.2]), 0.7
    res = frank_wolfe(FiniteClassOracle(H), X, A, B, lam, Mixture.of(H[0]), V[0], tol=1e-10, max_iter=2000)
    n = 60
    best = math.inf
    for i in range(n + 1):
        for j in range(n + 1 - i):
            for k in range(n + 1 - i - j):
                w = np.array([i, j, k, n - i - j - k]) / n
                best = min(best, objective(w @ V, A, B, lam))
    f = objective(res.z, A, B, lam)
    assert f <= best + 1e-9  # at least as good as the best grid mixture
    assert f >= best - 0.05  # and the grid (step 1/60) is close to the optimum
    assert res.gap <= 1e-10
    # z and the mixture's weights are each rounded once per step (values in [0, 1]): a few ulps per oracle call
    np.testing.assert_allclose(res.mixture.predict(X), res.z, rtol=0, atol=8 * res.calls * EPS)


def test_frank_wolfe_objective_non_increasing_and_gap_bounds_suboptimality():
    g = np.random.default_rng(5)
    X = g.random((40, 1))
    A, B, lam = g.random(40) * 0.2, g.standard_normal(40), 0.3
    oracle = StumpOracle([GRID], signs=(1,))
    mix, z = Mixture.of(oracle.default()), oracle.default().predict(X)
    # rounding of one evaluation of F (40 terms): 40 u sum|terms|; two evaluations: 40 eps sum|terms|
    f_tol = len(A) * EPS * (np.abs(A).sum() + np.abs(B).sum() + lam * len(A) * math.log(2))
    values = [objective(z, A, B, lam)]
    for _ in range(30):
        res = frank_wolfe(oracle, X, A, B, lam, mix, z, tol=0.0, max_iter=1)
        mix, z = res.mixture, res.z
        values.append(objective(z, A, B, lam))
    assert all(b <= a + f_tol for a, b in zip(values, values[1:]))
    final = frank_wolfe(oracle, X, A, B, lam, mix, z, tol=0.0, max_iter=3000)
    fstar = objective(final.z, A, B, lam)
    res = frank_wolfe(oracle, X, A, B, lam, mix, z, tol=0.0, max_iter=1)
    assert values[-1] - fstar <= res.gap + 2 * f_tol  # the FW gap at z bounds F(z) - min F


# ---- learners -------------------------------------------------------------------------------------------------


def _run(learner, adversary, T=120, seed=0):
    return play(learner, adversary, _beta, T, np.random.default_rng(seed))


def test_predictions_in_unit_interval_and_calls_within_budget():
    oracle = StumpOracle([GRID], signs=(1,))
    H = threshold_class(GRID)
    adv = BestResponseAdversary(H, np.random.default_rng(1).beta(2, 5, 300)[:, None])
    run = _run(HybridFTRL(oracle, "absolute", 120, max_iter=7), adv)
    assert np.all(run.predictions >= -1e-12) and np.all(run.predictions <= 1 + 1e-12)
    assert run.calls.max() <= 7 and run.calls[0] == 0


def test_regret_against_best_fixed_hypothesis_in_hindsight_by_brute_force():
    oracle = StumpOracle([GRID], signs=(1,))
    H = threshold_class(GRID)
    run = _run(HybridFTRL(oracle, "absolute", 80), AlternatingAdversary(H[3], H[9]), T=80)
    per_h = [np.abs(h.predict(run.X) - run.labels).sum() for h in H]
    # sums of 80 losses in [0, 1] in two orders: (n - 1) eps sum|loss| covers the rounding of both
    sum_tol = len(run.losses) * EPS * (run.losses.sum() + max(per_h))
    assert regret(run, oracle) == pytest.approx(run.losses.sum() - min(per_h), abs=2 * sum_tol)
    assert run.losses.sum() == pytest.approx(np.abs(run.predictions - run.labels).sum(), abs=sum_tol)


def test_infinite_eta_is_follow_the_leader():
    oracle = StumpOracle([GRID], signs=(1,))
    H = threshold_class(GRID)
    a = _run(HybridFTRL(oracle, "absolute", 100, eta=math.inf), RandomAdversary_(H), T=100, seed=3)
    b = _run(FollowTheLeader(oracle, "absolute", 100, tol=0.0), RandomAdversary_(H), T=100, seed=3)
    np.testing.assert_array_equal(a.predictions, b.predictions)


def RandomAdversary_(H):
    from rankwise.algorithms.hybrid_online import RandomAdversary

    return RandomAdversary(H, seed=11)


@pytest.mark.parametrize("eta", [1e2, 1e4, 1e6])
def test_large_eta_approaches_the_leaders_objective(eta):
    # F_unreg(FTRL decision) - min F_unreg <= (regulariser range) + FW tolerance = n log 2 / eta + tol
    oracle = StumpOracle([GRID], signs=(1,))
    H = threshold_class(GRID)
    learner = HybridFTRL(oracle, "absolute", 60, eta=eta, tol=1e-9, max_iter=500)
    g = np.random.default_rng(2)
    adv = RandomAdversary_(H)
    for t in range(60):
        h = learner.decide()
        if learner.n:
            X = learner.points
            best = float((class_values(H, X) @ learner._B[: learner.n]).min())
            f = learner.empirical_objective(h.predict(X))
            costs = np.abs(learner._A[: learner.n]).sum() + np.abs(learner._B[: learner.n]).sum()
            rounding = learner.n * EPS * costs  # two n-term evaluations of the objective
            assert f - best <= learner.n * math.log(2) / eta + 1e-9 + rounding
        learner.observe(g.beta(2, 5, 1), adv.choose(t, h))


def test_realisable_regret_grows_sublinearly():
    # fixed r in H: regret = the learner's own loss; it must grow much slower than T
    oracle = StumpOracle([GRID], signs=(1,))
    H = threshold_class(GRID)
    r = [regret(_run(HybridFTRL(oracle, "absolute", T), FixedAdversary(H[6]), T=T, seed=4), oracle)
         for T in (50, 400)]
    assert r[1] < 8 * r[0] * 0.5 and r[1] < 0.1 * 400


def test_ftrl_beats_ftl_against_best_response():
    oracle = StumpOracle([GRID], signs=(1,))
    H = threshold_class(GRID)
    pool = np.random.default_rng(9).beta(2, 5, 500)[:, None]
    T = 300
    ftrl = regret(_run(HybridFTRL(oracle, "absolute", T), BestResponseAdversary(H, pool), T=T), oracle)
    ftl = regret(_run(FollowTheLeader(oracle, "absolute", T), BestResponseAdversary(H, pool), T=T), oracle)
    assert ftl > 2 * ftrl  # FTL is exploited every round, FTRL's mixture is not


def test_squared_loss_and_ftpl_run_and_stay_in_range():
    oracle = StumpOracle([GRID], signs=(1,))
    H = threshold_class(GRID)
    for learner in (HybridFTRL(oracle, "squared", 60), FollowTheLeader(oracle, "squared", 60),
                    FollowPerturbedLeader(oracle, "squared", 60, samples=3), FollowPerturbedLeader(oracle, horizon=60)):
        run = _run(learner, AlternatingAdversary(H[2], H[8]), T=60)
        assert np.all(run.predictions >= -1e-12) and np.all(run.predictions <= 1 + 1e-12)
        assert np.isfinite(regret(run, oracle, learner.loss))


def test_sklearn_oracle_inside_the_learner_on_two_features():
    grid = np.linspace(0, 1, 11)
    exact = StumpOracle([grid, grid])
    R = _stumps_2d(np.linspace(0.2, 0.8, 3))
    g = np.random.default_rng(0)
    pool = g.random((200, 2))
    run = play(HybridFTRL(SklearnERMOracle(dim=2), "absolute", 60, max_iter=5), BestResponseAdversary(R, pool),
               lambda r: r.random(2), 60, np.random.default_rng(1))
    assert np.isfinite(regret(run, StumpOracle([np.r_[np.unique(run.X[:, f]), np.inf] for f in range(2)])))
    assert exact.size == 44


def test_timing_adversary_never_sees_x_t():
    seen = []

    class Spy:
        def choose(self, t, decision):
            seen.append(t)
            return Stump(0, 0.3, 1)

    oracle = StumpOracle([GRID], signs=(1,))
    learner = HybridFTRL(oracle, "absolute", 10)
    run = play(learner, Spy(), _beta, 10, np.random.default_rng(0))
    assert seen == list(range(10)) and learner.n == 10 and run.X.shape == (10, 1)


# ---- the game ------------------------------------------------------------------------------------------------


def _game():
    edges = np.linspace(0, 1, 21)
    atoms = ((edges[:-1] + edges[1:]) / 2)[:, None]
    p = np.full(20, 1 / 20)
    return threshold_class(np.linspace(0, 1, 6) + 0.01), interval_class(np.linspace(0, 1, 5) + 0.01), atoms, p


def test_matrix_game_against_known_values():
    sol = matrix_game(np.array([[1.0, 0.0], [0.0, 1.0]]))  # matching pennies (loss): value 1/2, uniform
    assert sol.value == pytest.approx(0.5, abs=1e-9) and sol.dual_value == pytest.approx(0.5, abs=1e-9)
    np.testing.assert_allclose(sol.row, [0.5, 0.5], atol=1e-9)
    sol = matrix_game(np.array([[0.3, 0.8], [0.5, 0.6]]))  # saddle point at row 1, column 1
    assert sol.value == pytest.approx(0.6, abs=1e-9)


def test_learned_game_brackets_the_linprog_value_and_gap_shrinks():
    H, R, atoms, p = _game()
    M = payoff_matrix(H, R, atoms, p)
    sol = matrix_game(M)
    # the LP's strategies certify the value
    assert (sol.row @ M).max() == pytest.approx(sol.value, abs=1e-9)
    assert (M @ sol.col).min() == pytest.approx(sol.value, abs=1e-9)
    gaps = []
    for m in (30, 600):
        g = learn_game(lambda T: HybridFTRL(FiniteClassOracle(H, dim=1), "absolute", T), H, R, atoms, p, m,
                       np.random.default_rng(0), sol)
        assert g.exploitability_row >= -1e-12 and g.exploitability_col >= -1e-12
        assert abs(g.value_estimate - sol.value) <= g.duality_gap + 1e-12
        gaps.append(g.duality_gap)
    assert gaps[1] < gaps[0]


def test_payoff_matrix_by_hand():
    H, R = [Stump(0, 0.5, 1)], [Stump(0, 0.0, 1), Stump(0, 0.5, 1)]
    M = payoff_matrix(H, R, np.array([[0.25], [0.75]]), np.array([0.4, 0.6]))
    np.testing.assert_allclose(M, [[0.4, 0.0]], atol=1e-15)


def test_rademacher_of_a_single_function_is_zero_mean_and_of_all_signs_is_one():
    g = np.random.default_rng(0)
    atoms = np.arange(8)
    all_signs = np.array([[(i >> k) & 1 for k in range(8)] for i in range(256)], dtype=float) * 2 - 1
    assert empirical_rademacher(all_signs, atoms, 50, g) == pytest.approx(1.0)
    assert abs(empirical_rademacher(np.ones((1, 8)), atoms, 4000, g)) < 0.05  # E sigma = 0, sd 1/sqrt(8 * 4000)


# ---- refusals --------------------------------------------------------------------------------------------------


class _Raises(LinearOracle):
    dim = 1

    def argmin(self, X, costs):
        raise RuntimeError("solver crashed")

    def default(self):
        return Stump(0, 0.5, 1)


class _BadAnswer(_Raises):
    def argmin(self, X, costs):
        return Constant(2.0)


def test_an_oracle_that_raises_or_answers_badly_is_a_clear_error():
    X = np.random.default_rng(0).random((5, 1))
    with pytest.raises(OracleError, match="raised RuntimeError: solver crashed"):
        call_oracle(_Raises(), X, np.ones(5))
    with pytest.raises(OracleError, match="values in \\[0, 1\\]"):
        call_oracle(_BadAnswer(), X, np.ones(5))
    learner = HybridFTRL(_Raises(), "absolute", 10)
    learner.decide()
    learner.observe([0.3], Stump(0, 0.2, 1))
    with pytest.raises(OracleError):
        learner.decide()
    assert issubclass(OracleError, RankwiseError)

    class NoDefault(_Raises):
        def default(self):
            raise KeyError("nothing")

    with pytest.raises(OracleError, match="default"):
        HybridFTRL(NoDefault(), "absolute", 10).decide()


def test_empty_classes_are_refused():
    with pytest.raises(InvalidInputError, match="empty"):
        FiniteClassOracle([])
    with pytest.raises(InvalidInputError, match="got none"):
        StumpOracle([])
    with pytest.raises(InvalidInputError, match="empty"):
        StumpOracle([np.array([])])
    with pytest.raises(InvalidInputError, match="empty"):
        BestResponseAdversary([], np.zeros((3, 1)))
    with pytest.raises(InvalidInputError, match="empty"):
        payoff_matrix([], [Stump(0, 0.5)], np.zeros((2, 1)), np.array([0.5, 0.5]))


def test_mismatched_shapes_and_bad_values_are_refused():
    oracle = StumpOracle([GRID], signs=(1,))
    X = np.random.default_rng(0).random((5, 1))
    with pytest.raises(InvalidInputError, match="costs must be"):
        call_oracle(oracle, X, np.ones(4))
    with pytest.raises(InvalidInputError, match="features"):
        call_oracle(oracle, np.zeros((5, 2)), np.ones(5))
    with pytest.raises(InvalidInputError, match="NaN"):
        call_oracle(oracle, X, np.r_[np.ones(4), np.nan])
    with pytest.raises(InvalidInputError, match="labels must be"):
        best_fixed_loss(oracle, X, np.ones(4))
    with pytest.raises(InvalidInputError, match="binary"):
        oracle_label = type("Half", (), {"predict": lambda self, X: np.full(len(X), 0.5), "key": None})()
        learner = HybridFTRL(oracle, "absolute", 10)
        learner.decide()
        learner.observe([0.1], Stump(0, 0.5))
        learner.decide()
        learner.observe([0.2], oracle_label)
    learner = HybridFTRL(oracle, "absolute", 10)
    learner.decide()
    with pytest.raises(InvalidInputError, match="features"):
        learner.observe([0.1, 0.2], Stump(0, 0.5))
    with pytest.raises(InvalidInputError, match="horizon"):
        HybridFTRL(oracle, "absolute", 1)
    with pytest.raises(InvalidInputError, match="eta"):
        HybridFTRL(oracle, "absolute", 10, eta=-1.0)
    with pytest.raises(InvalidInputError, match="loss"):
        HybridFTRL(oracle, "hinge", 10)
    with pytest.raises(InvalidInputError, match="M must be"):
        matrix_game(np.zeros(3))
    with pytest.raises(InvalidInputError, match="probs"):
        payoff_matrix([Stump(0, 0.5)], [Stump(0, 0.5)], np.zeros((2, 1)), np.array([0.7, 0.7]))
