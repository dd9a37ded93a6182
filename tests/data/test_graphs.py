import math

import pytest
import torch

from rankwise.data import graphs
from rankwise.data.graphs import (CSBMConfig, block_densities, csbm_pair, degree_features, drosophila_pair,
                                  load_drosophila)
from rankwise.errors import InvalidInputError, MissingPackageError, UnknownNameError

CONFIG = CSBMConfig(num_nodes=600, num_classes=3, num_features=16, p_in=0.10, p_out=0.02, target_p_in=0.06,
                    target_p_out=0.04, feature_shift=1.5)


def _binomial_tolerance(p: float, pairs: int, sigmas: float = 5.0) -> float:
    return sigmas * math.sqrt(p * (1 - p) / pairs)


def test_csbm_edge_densities_match_the_parameters_within_binomial_noise():
    pair = csbm_pair(CONFIG, seed=0)
    for graph, (p_in, p_out) in ((pair.source, (CONFIG.p_in, CONFIG.p_out)),
                                 (pair.target, (CONFIG.target_p_in, CONFIG.target_p_out))):
        sizes = graph.class_counts()
        same_pairs = int((sizes * (sizes - 1) // 2).sum())
        different_pairs = graph.num_nodes * (graph.num_nodes - 1) // 2 - same_pairs
        within, between = block_densities(graph)
        assert abs(within - p_in) < _binomial_tolerance(p_in, same_pairs)
        assert abs(between - p_out) < _binomial_tolerance(p_out, different_pairs)


def test_csbm_structure_features_and_shift():
    pair = csbm_pair(CONFIG, seed=1)
    for graph in (pair.source, pair.target):
        a = graph.adjacency
        assert a.shape == (600, 600) and graph.features.shape == (600, 16) and graph.labels.shape == (600,)
        assert torch.equal(a, a.T) and not a.diagonal().any() and set(a.unique().tolist()) <= {0.0, 1.0}
        assert graph.class_counts().tolist() == [200, 200, 200]
    # Class means sit `separation` apart; each estimate from 200 nodes has noise sigma * sqrt(F / 200) = 0.28.
    means = torch.stack([pair.source.features[pair.source.labels == c].mean(0) for c in range(3)])
    assert abs(float((means[0] - means[1]).norm()) - CONFIG.separation) < 0.5
    # The target's features are the source's distribution moved by a vector of norm feature_shift.
    shift = pair.target.features.mean(0) - pair.source.features.mean(0)
    assert abs(float(shift.norm()) - CONFIG.feature_shift) < 4 * math.sqrt(2 * 16 / 600)
    unshifted = csbm_pair(CSBMConfig(num_nodes=600, feature_shift=0.0), seed=1)
    assert float((unshifted.target.features.mean(0) - unshifted.source.features.mean(0)).norm()) < 0.6


def test_csbm_is_a_pure_function_of_the_seed():
    a, b, c = csbm_pair(CONFIG, seed=7), csbm_pair(CONFIG, seed=7), csbm_pair(CONFIG, seed=8)
    for x, y in ((a.source, b.source), (a.target, b.target)):
        assert torch.equal(x.adjacency, y.adjacency) and torch.equal(x.features, y.features)
        assert torch.equal(x.labels, y.labels)
    assert not torch.equal(a.source.adjacency, c.source.adjacency)
    assert not torch.equal(a.source.features, a.target.features[: a.source.num_nodes])  # independent draws


def test_csbm_target_class_shift_and_sizes():
    pair = csbm_pair(CSBMConfig(num_nodes=200, target_nodes=300, class_weights=(3.0, 1.0, 1.0)), seed=0)
    assert pair.source.class_counts().tolist() == [67, 67, 66]
    assert pair.target.class_counts().tolist() == [180, 60, 60]


def test_csbm_bad_input_raises_before_any_work(monkeypatch):
    monkeypatch.setattr(graphs, "csbm_means", lambda *a: pytest.fail("validated too late"))
    for bad in (CSBMConfig(num_nodes=graphs.MAX_DENSE_NODES + 1), CSBMConfig(p_in=1.5), CSBMConfig(target_p_out=-0.1),
                CSBMConfig(num_nodes=2, num_classes=3), CSBMConfig(class_weights=(1.0, 2.0)),
                CSBMConfig(num_classes=1), CSBMConfig(feature_shift=-1.0)):
        with pytest.raises(InvalidInputError):
            csbm_pair(bad)
    monkeypatch.undo()
    with pytest.raises(InvalidInputError, match="num_features"):
        csbm_pair(CSBMConfig(num_features=2, num_classes=3))


def test_drosophila_hemispheres_node_counts_and_cell_types():
    pair = drosophila_pair()
    left, right = pair.source, pair.target
    assert left.num_nodes == 209 and right.num_nodes == 213
    assert left.class_names == right.class_names == ("I", "K", "O", "P")
    assert left.class_counts().tolist() == [21, 101, 29, 58]
    assert right.class_counts().tolist() == [21, 100, 29, 63]
    for g in (left, right):
        assert g.adjacency.shape == (g.num_nodes, g.num_nodes) and (g.adjacency >= 0).all()
        assert not torch.equal(g.adjacency, g.adjacency.T)  # directed synapse counts
        assert g.adjacency.max() > 1 and not g.adjacency.diagonal().any()
        assert g.features.shape == (g.num_nodes, 2 * graphs.DEGREE_BINS)
        assert torch.equal(g.features.sum(1), torch.full((g.num_nodes,), 2.0))  # one in- and one out-degree bin
    parts = left.split(seed=0, fractions=(0.8, 0.2))
    assert sum(p.numel() for p in parts) == 209 and set(left.labels[parts[1]].tolist()) == {0, 1, 2, 3}


def test_degree_features_bins():
    a = torch.zeros(4, 4)
    a[0, 1] = a[0, 2] = a[0, 3] = 5.0  # out-degree 3 (weights do not count), in-degree 0
    f = degree_features(a, num_bins=3)
    assert f[0].tolist() == [1, 0, 0, 0, 0, 1]  # in: bin 0 (degree 0); out: bin 2 (degrees 2-3)
    with pytest.raises(InvalidInputError):
        degree_features(a, num_bins=2)  # degree 3 needs bin 2
    with pytest.raises(InvalidInputError):
        degree_features(torch.zeros(3, 4))


def test_connectome_errors(monkeypatch):
    with pytest.raises(UnknownNameError):
        load_drosophila("middle")

    def absent(module):
        raise MissingPackageError(f"{module} is not installed")

    monkeypatch.setattr(graphs, "package_dir", absent)
    with pytest.raises(MissingPackageError, match=r"pip install --no-deps graspologic==3\.4\.4"):
        drosophila_pair()
