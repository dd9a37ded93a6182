"""GuardSpace's null_threshold selection: the lowest validation task NLL among the thresholds whose validation
protected drift is within the claims' bound; the most protective threshold when none is."""

import math

from rankwise.repro.guardspace.main import DRIFT_BOUND, _choose_threshold

GRID = (1e-6, 1e-5, 1e-4, 1e-3)


def _runs(losses, kls):
    return [{"val_loss": v, "val_protected_KL": k} for v, k in zip(losses, kls)]


def test_best_task_loss_among_thresholds_within_the_bound():
    # 1e-3 has the best task loss but drifts past the bound: it must not be chosen
    sel = _choose_threshold(GRID, _runs([0.9, 0.8, 0.7, 0.5], [1e-6, 1e-5, DRIFT_BOUND, 10 * DRIFT_BOUND]))
    assert sel.chosen == 1e-4
    assert math.isinf(sel.scores[3])


def test_a_drift_within_the_bound_does_not_override_the_task_loss():
    sel = _choose_threshold(GRID, _runs([0.7, 0.8, 0.9, 1.0], [1e-6] * 4))
    assert sel.chosen == 1e-6


def test_no_feasible_threshold_falls_back_to_the_most_protective():
    sel = _choose_threshold(GRID, _runs([0.9, 0.8, 0.7, 0.5], [1.0] * 4))
    assert sel.chosen == 1e-6
    assert sel.param == "null_threshold"
