"""Group fairness of binary predictions: demographic parity and equalised odds gaps, per-group and worst-group
accuracy (the paper's metrics, as its code computes them; fairlearn's `demographic_parity_difference` and
`equalized_odds_difference` with method="between_groups" give the same numbers, see the tests).

    m = fairness_metrics(y_true, y_pred, groups)    # y_true, y_pred [N] in {0, 1}; groups [N] int codes
    m.dpd, m.eod, m.accuracy, m.worst_group_accuracy, m.per_group["accuracy"]  # [G]

- DPD = max_g P(y^=1 | g) - min_g P(y^=1 | g).
- EOD = max(max_g TPR_g - min_g TPR_g, max_g FPR_g - min_g FPR_g).
- One-vs-rest gaps per group (the card's proposed reading of the paper's per-subgroup numbers):
  |P(y^=1 | g) - P(y^=1 | not g)|, and likewise max of the TPR and FPR gaps; macro = their mean, worst = max.

Every group in 0..G-1 must have members (a group with none has no rate, and silently leaving it out changes what
max - min means); a group with no positive (negative) example has no TPR (FPR), which is refused too, where the
authors' code and fairlearn would count it as 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError


def _check(y_true: torch.Tensor | None, y_pred: torch.Tensor, groups: torch.Tensor, num_groups: int | None) -> int:
    tensors = {"y_pred": y_pred, "groups": groups} | ({} if y_true is None else {"y_true": y_true})
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise InvalidInputError(f"{name} must be a 1-D integer tensor [N], got "
                                    f"{getattr(t, 'shape', type(t).__name__)} {getattr(t, 'dtype', '')}")
    n = y_pred.numel()
    if n == 0 or any(t.numel() != n for t in tensors.values()):
        raise InvalidInputError(f"y_true, y_pred and groups need the same, non-zero length; got "
                                f"{ {k: t.numel() for k, t in tensors.items()} }")
    for name in ("y_pred", "y_true"):
        t = tensors.get(name)
        if t is not None and bool(((t != 0) & (t != 1)).any()):
            raise InvalidInputError(f"{name} must hold binary labels 0 / 1")
    if int(groups.min()) < 0:
        raise InvalidInputError("group codes must be >= 0")
    g = int(groups.max()) + 1 if num_groups is None else int(num_groups)
    if int(groups.max()) >= g:
        raise InvalidInputError(f"group code {int(groups.max())} >= num_groups {g}")
    counts = torch.bincount(groups, minlength=g)
    empty = torch.nonzero(counts == 0).flatten().tolist()
    if empty:
        raise InvalidInputError(f"groups {empty} have no member; every group needs at least one row (drop the group "
                                "or choose a split where it appears)")
    if g < 2:
        raise InvalidInputError("group gaps need at least 2 groups")
    return g


def _rate(num: torch.Tensor, den: torch.Tensor, what: str) -> torch.Tensor:
    missing = torch.nonzero(den == 0).flatten().tolist()
    if missing:
        raise InvalidInputError(f"groups {missing} have no {what}, so their rate is undefined")
    return num.double() / den.double()


def selection_rates(y_pred: torch.Tensor, groups: torch.Tensor, num_groups: int | None = None) -> torch.Tensor:
    """P(y^=1 | g) per group. -> [G] float64"""
    g = _check(None, y_pred, groups, num_groups)
    return _rate(torch.bincount(groups, weights=y_pred.double(), minlength=g), torch.bincount(groups, minlength=g),
                 "members")


def true_false_positive_rates(y_true: torch.Tensor, y_pred: torch.Tensor, groups: torch.Tensor,
                              num_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(TPR_g, FPR_g) per group. -> two [G] float64"""
    g = _check(y_true, y_pred, groups, num_groups)
    pos, neg = y_true == 1, y_true == 0
    tp = torch.bincount(groups[pos], weights=y_pred[pos].double(), minlength=g)
    fp = torch.bincount(groups[neg], weights=y_pred[neg].double(), minlength=g)
    return (_rate(tp, torch.bincount(groups[pos], minlength=g), "positive example"),
            _rate(fp, torch.bincount(groups[neg], minlength=g), "negative example"))


def demographic_parity_difference(y_pred: torch.Tensor, groups: torch.Tensor, num_groups: int | None = None) -> float:
    """max_g P(y^=1 | g) - min_g P(y^=1 | g), in [0, 1]."""
    r = selection_rates(y_pred, groups, num_groups)
    return float(r.max() - r.min())


def equalized_odds_difference(y_true: torch.Tensor, y_pred: torch.Tensor, groups: torch.Tensor,
                              num_groups: int | None = None) -> float:
    """max(TPR gap, FPR gap) between groups (max - min each), in [0, 1]."""
    tpr, fpr = true_false_positive_rates(y_true, y_pred, groups, num_groups)
    return float(max(tpr.max() - tpr.min(), fpr.max() - fpr.min()))


def one_vs_rest_gaps(y_true: torch.Tensor, y_pred: torch.Tensor, groups: torch.Tensor,
                     num_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group g, (|P(y^=1|g) - P(y^=1|not g)|, max(|TPR_g - TPR_not g|, |FPR_g - FPR_not g|)). -> two [G]"""
    g = _check(y_true, y_pred, groups, num_groups)
    dp, eo = torch.zeros(g, dtype=torch.float64), torch.zeros(g, dtype=torch.float64)
    for k in range(g):
        binary = (groups == k).long()  # 1: group k, 0: the rest
        dp[k] = demographic_parity_difference(y_pred, binary, 2)
        eo[k] = equalized_odds_difference(y_true, y_pred, binary, 2)
    return dp, eo


@dataclass(frozen=True)
class FairnessMetrics:
    """Accuracy and group gaps of one set of predictions; per-group tensors are [G] float64 (group codes 0..G-1)."""

    accuracy: float
    dpd: float
    eod: float
    equal_opportunity: float  # the TPR gap alone
    group_accuracy: torch.Tensor
    selection_rate: torch.Tensor
    tpr: torch.Tensor
    fpr: torch.Tensor
    dpd_vs_rest: torch.Tensor
    eod_vs_rest: torch.Tensor

    @property
    def worst_group_accuracy(self) -> float:
        return float(self.group_accuracy.min())

    @property
    def gap(self) -> float:
        """(DPD + EOD) / 2: the one fairness number a selection rule reads."""
        return 0.5 * (self.dpd + self.eod)

    def macro(self) -> tuple[float, float]:
        """(mean one-vs-rest DPD, mean one-vs-rest EOD) over groups."""
        return float(self.dpd_vs_rest.mean()), float(self.eod_vs_rest.mean())

    def worst(self) -> tuple[float, float]:
        """(max one-vs-rest DPD, max one-vs-rest EOD) over groups."""
        return float(self.dpd_vs_rest.max()), float(self.eod_vs_rest.max())


def fairness_metrics(y_true: torch.Tensor, y_pred: torch.Tensor, groups: torch.Tensor,
                     num_groups: int | None = None) -> FairnessMetrics:
    """Every metric above for binary labels and predictions y_true, y_pred [N] and group codes groups [N]."""
    g = _check(y_true, y_pred, groups, num_groups)
    correct = (y_true == y_pred).double()
    group_acc = torch.bincount(groups, weights=correct, minlength=g) / torch.bincount(groups, minlength=g).double()
    sel = selection_rates(y_pred, groups, g)
    tpr, fpr = true_false_positive_rates(y_true, y_pred, groups, g)
    dp_r, eo_r = one_vs_rest_gaps(y_true, y_pred, groups, g)
    return FairnessMetrics(accuracy=float(correct.mean()), dpd=float(sel.max() - sel.min()),
                           eod=float(max(tpr.max() - tpr.min(), fpr.max() - fpr.min())),
                           equal_opportunity=float(tpr.max() - tpr.min()), group_accuracy=group_acc,
                           selection_rate=sel, tpr=tpr, fpr=fpr, dpd_vs_rest=dp_r, eod_vs_rest=eo_r)
