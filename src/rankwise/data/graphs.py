"""Graph domain-adaptation pairs as dense tensors: a source graph with labels to train on, and a target graph from a
shifted distribution whose labels are for evaluation only.

    pair = csbm_pair(CSBMConfig(), seed=0)        # synthetic: structural and feature shift, controlled
    pair = drosophila_pair()                      # real: larva mushroom-body connectome, left -> right hemisphere
    pair.source.adjacency [N, N], pair.source.features [N, F], pair.source.labels [N]

Contextual stochastic block model (CSBM): C blocks of (nearly) equal size; an undirected edge joins two nodes of the
same block with probability `p_in`, of different blocks with `p_out`; node features are Gaussian around a class mean
(class means at pairwise distance `separation`, noise `sigma`). The target shares the class means and differs by its
edge probabilities (a structural shift) and by a mean shift of all its features of norm `feature_shift` (a feature
shift). Generated with torch alone, as a pure function of the seed.

Connectome: the Drosophila larva mushroom body (Eichler et al. 2017, Nature 548:175), as the PyPI package
`graspologic` bundles it: left 209 / right 213 neurons, 4 cell types (I, K, O, P), weighted directed adjacency
(synapse counts). Read from its CSV files; the package is installed with `--no-deps` and never imported (it pins
numpy<2). Its neurons have no features, so the node features are structural (`degree_features`: one-hot log2 bins of
in- and out-degree), which both hemispheres share by construction, as the one-hot degree features of the
Airport domain-adaptation benchmarks.

The node split of a graph (`Graph.split`) is stratified by class (`rankwise.data.splits.stratified_split`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rankwise.core.packages import package_dir
from rankwise.data.splits import largest_remainder, stratified_split
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError, UnknownNameError

DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)  # train, val, test nodes

GRASPOLOGIC = "graspologic==3.4.4"
HEMISPHERES = {"left": 209, "right": 213}  # neurons per hemisphere, as the source documents
CELL_TYPES = ("I", "K", "O", "P")  # input (projection) neurons, Kenyon cells, output neurons, projection neurons
MAX_DENSE_NODES = 4096  # a dense [N, N] float32 adjacency of 4096 nodes is 64 MiB: past that, dense is the wrong tool
DEGREE_BINS = 9  # log2 bins 0..8 cover degrees up to 511, more than the 2 x 213 a hemisphere allows


@dataclass(frozen=True)
class Graph:
    """One graph. `adjacency` [N, N] float32 (row i, column j: an edge i -> j; symmetric for an undirected graph;
    zero diagonal), `features` [N, F] float32, `labels` [N] int64 codes into `class_names`."""

    adjacency: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    class_names: tuple[str, ...]

    @property
    def num_nodes(self) -> int:
        return int(self.labels.numel())

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def class_counts(self) -> torch.Tensor:
        """Nodes per class. -> [C] int64"""
        return torch.bincount(self.labels, minlength=self.num_classes)

    def split(self, seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> tuple[torch.Tensor, ...]:
        """Node indices of each part, stratified by class. -> one sorted int64 tensor per fraction"""
        return stratified_split(self.labels, fractions, seed)


@dataclass(frozen=True)
class GraphPair:
    """A domain-adaptation pair: train on `source` (labels known), predict `target` (labels only for evaluation).
    Both have the same feature width and the same classes."""

    name: str
    source: Graph
    target: Graph


@dataclass(frozen=True)
class CSBMConfig:
    """A source CSBM and its shifted target. Probabilities are per node pair; `separation` is the distance between
    any two class means and `sigma` the per-feature noise, in feature units."""

    num_nodes: int = 300
    num_classes: int = 3
    num_features: int = 16
    p_in: float = 0.10
    p_out: float = 0.02
    separation: float = 2.0
    sigma: float = 1.0
    target_nodes: int | None = None  # None: as many as the source
    target_p_in: float = 0.06  # a weaker community structure in the target
    target_p_out: float = 0.04
    feature_shift: float = 1.0  # norm of the mean shift added to every target feature vector
    class_weights: tuple[float, ...] = field(default=())  # target class proportions; () = balanced, as the source


def csbm_graph(num_nodes: int, p_in: float, p_out: float, means: torch.Tensor, sigma: float, seed: int,
               class_weights: Sequence[float] = (), shift: torch.Tensor | None = None) -> Graph:
    """One CSBM graph. means [C, F]: the class means; shift [F] (optional) is added to every node's features.

    Labels: class sizes as equal as possible (or in proportion to `class_weights`), in a seeded random node order.
    -> Graph with a symmetric 0/1 adjacency [N, N] and features [N, F]
    """
    num_classes, num_features = means.shape
    _check_count("num_nodes", num_nodes, num_classes)
    _check_probability("p_in", p_in)
    _check_probability("p_out", p_out)
    _check_weights(class_weights, num_classes)
    if not sigma >= 0:
        raise InvalidInputError(f"sigma must be >= 0, got {sigma}")
    generator = torch.Generator().manual_seed(int(seed))
    sizes = _class_sizes(num_nodes, num_classes, class_weights)
    labels = torch.repeat_interleave(torch.arange(num_classes), torch.tensor(sizes))
    labels = labels[torch.randperm(num_nodes, generator=generator)]
    same = labels[:, None] == labels[None, :]
    probability = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
    draws = torch.rand(num_nodes, num_nodes, generator=generator) < probability
    upper = torch.triu(draws, diagonal=1)  # one draw per unordered pair, then mirrored: undirected, no self-loops
    adjacency = (upper | upper.T).float()
    noise = torch.randn(num_nodes, num_features, generator=generator) * sigma
    features = means[labels] + noise + (shift if shift is not None else 0.0)
    return Graph(adjacency, features.float(), labels, tuple(f"block{c}" for c in range(num_classes)))


def csbm_means(num_classes: int, num_features: int, separation: float, seed: int) -> torch.Tensor:
    """Class means at pairwise distance `separation`: scaled orthonormal directions (seeded). -> [C, F]"""
    if num_features < num_classes:
        raise InvalidInputError(f"num_features ({num_features}) must be >= num_classes ({num_classes}) for "
                                "orthogonal class means")
    generator = torch.Generator().manual_seed(int(seed))
    q, _ = torch.linalg.qr(torch.randn(num_features, num_classes, generator=generator, dtype=torch.float64))
    # |a q_i - a q_j| = a sqrt(2) for orthonormal q_i, q_j.
    return (q.T * (separation / math.sqrt(2))).float()


def csbm_pair(config: CSBMConfig = CSBMConfig(), seed: int = 0) -> GraphPair:
    """A source CSBM and a target CSBM with shifted edge probabilities and features (see the module text)."""
    c = config
    if c.num_classes < 2:
        raise InvalidInputError(f"a CSBM needs >= 2 classes, got {c.num_classes}")
    target_nodes = c.num_nodes if c.target_nodes is None else c.target_nodes
    _check_count("num_nodes", c.num_nodes, c.num_classes)
    _check_count("target_nodes", target_nodes, c.num_classes)
    _check_weights(c.class_weights, c.num_classes)
    for name in ("p_in", "p_out", "target_p_in", "target_p_out"):
        _check_probability(name, getattr(c, name))
    if not (c.feature_shift >= 0 and c.sigma >= 0):
        raise InvalidInputError(f"feature_shift and sigma must be >= 0, got {c.feature_shift}, {c.sigma}")
    # Four independent streams from one seed: class means, shift direction, source graph, target graph.
    streams = torch.randint(0, 2**62, (4,), generator=torch.Generator().manual_seed(int(seed))).tolist()
    means = csbm_means(c.num_classes, c.num_features, c.separation, streams[0])
    direction = torch.randn(c.num_features, generator=torch.Generator().manual_seed(streams[1]))
    shift = direction / direction.norm() * c.feature_shift
    source = csbm_graph(c.num_nodes, c.p_in, c.p_out, means, c.sigma, streams[2])
    target = csbm_graph(target_nodes, c.target_p_in, c.target_p_out, means, c.sigma, streams[3],
                        class_weights=c.class_weights, shift=shift)
    return GraphPair("csbm", source, target)


def block_densities(graph: Graph) -> tuple[float, float]:
    """(edge density among same-class pairs, among different-class pairs) of an undirected graph, for checking a
    CSBM against its p_in / p_out."""
    upper = torch.triu(torch.ones(graph.num_nodes, graph.num_nodes, dtype=torch.bool), diagonal=1)
    same = (graph.labels[:, None] == graph.labels[None, :]) & upper
    different = ~(graph.labels[:, None] == graph.labels[None, :]) & upper
    edges = graph.adjacency > 0
    return (float(edges[same].float().mean()) if same.any() else math.nan,
            float(edges[different].float().mean()) if different.any() else math.nan)


def graspologic_folder() -> Path:
    """The installed `graspologic/datasets/drosophila` folder, found without importing the package."""
    try:
        return package_dir("graspologic") / "datasets" / "drosophila"
    except MissingPackageError:
        raise MissingPackageError(f"the Drosophila connectome comes from the data files of the PyPI package "
                                  f"graspologic; install it with: pip install --no-deps {GRASPOLOGIC} "
                                  "(or run `make install`)") from None


def load_drosophila(hemisphere: str, num_bins: int = DEGREE_BINS) -> Graph:
    """One hemisphere of the larva mushroom-body connectome: weighted directed adjacency (synapse counts) [N, N],
    `degree_features` [N, 2 * num_bins], cell-type labels [N] (codes into CELL_TYPES)."""
    if hemisphere not in HEMISPHERES:
        raise UnknownNameError(f"unknown hemisphere {hemisphere!r}; choose one of {tuple(HEMISPHERES)}")
    folder = graspologic_folder()
    paths = [folder / f"{hemisphere}_adjacency.csv", folder / f"{hemisphere}_cell_labels.csv"]
    for path in paths:
        if not path.is_file():
            raise MissingPackageError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall "
                                      f"{GRASPOLOGIC}")
    try:
        counts = np.loadtxt(paths[0], dtype=np.int64, ndmin=2)
        names = np.loadtxt(paths[1], dtype=str, ndmin=1)
    except ValueError as e:
        raise CorruptFileError(f"{paths[0].parent}: unreadable {hemisphere} connectome ({e})") from None
    n = HEMISPHERES[hemisphere]
    if counts.shape != (n, n) or names.shape != (n,) or (counts < 0).any():
        raise CorruptFileError(f"{hemisphere} connectome: adjacency {counts.shape}, {names.shape[0]} labels; the "
                               f"source documents {n} neurons with non-negative synapse counts")
    unknown = set(names.tolist()) - set(CELL_TYPES)
    if unknown:
        raise CorruptFileError(f"{hemisphere} connectome: unknown cell type(s) {sorted(unknown)}, "
                               f"expected {CELL_TYPES}")
    adjacency = torch.from_numpy(counts).float()
    labels = torch.tensor([CELL_TYPES.index(x) for x in names.tolist()], dtype=torch.long)
    return Graph(adjacency, degree_features(adjacency, num_bins), labels, CELL_TYPES)


def drosophila_pair(num_bins: int = DEGREE_BINS) -> GraphPair:
    """Left hemisphere (source, 209 neurons) -> right hemisphere (target, 213 neurons)."""
    return GraphPair("drosophila-left-right", load_drosophila("left", num_bins), load_drosophila("right", num_bins))


def degree_features(adjacency: torch.Tensor, num_bins: int = DEGREE_BINS) -> torch.Tensor:
    """One-hot log2 bins of each node's in- and out-degree (edges counted once, whatever their weight): bin
    floor(log2(1 + degree)), so bin 0 is degree 0, bin 1 degree 1, bin 2 degrees 2-3, ... A pure function of a
    node's own degree, so two graphs of any size share the feature space. adjacency [N, N] -> [N, 2 * num_bins]"""
    if adjacency.dim() != 2 or adjacency.shape[0] != adjacency.shape[1]:
        raise InvalidInputError(f"adjacency must be square [N, N], got {tuple(adjacency.shape)}")
    if num_bins < 1:
        raise InvalidInputError(f"num_bins must be >= 1, got {num_bins}")
    edges = (adjacency != 0).float()
    blocks = []
    for degree in (edges.sum(dim=0), edges.sum(dim=1)):  # in-degree (column sums), out-degree (row sums)
        bins = torch.floor(torch.log2(degree + 1)).long()
        if int(bins.max()) >= num_bins:
            raise InvalidInputError(f"a degree of {int(degree.max())} needs {int(bins.max()) + 1} log2 bins; "
                                    f"num_bins is {num_bins}")
        blocks.append(torch.nn.functional.one_hot(bins, num_bins).float())
    return torch.cat(blocks, dim=1)


def _class_sizes(n: int, num_classes: int, weights: Sequence[float]) -> list[int]:
    total = float(sum(weights)) if weights else float(num_classes)
    sizes = largest_remainder(n, [w / total for w in weights] if weights else [1 / num_classes] * num_classes)
    if min(sizes) < 1:
        raise InvalidInputError(f"{n} nodes leave a class empty with class weights {tuple(weights)}")
    return sizes


def _check_weights(weights: Sequence[float], num_classes: int) -> None:
    if weights and (len(weights) != num_classes or any(not math.isfinite(w) or w <= 0 for w in weights)):
        raise InvalidInputError(f"class_weights must be {num_classes} positive numbers, got {tuple(weights)}")


def _check_probability(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise InvalidInputError(f"{name} must be a probability in [0, 1], got {p}")


def _check_count(name: str, n: int, num_classes: int) -> None:
    if not isinstance(n, int) or n < num_classes:
        raise InvalidInputError(f"{name} must be an integer >= the number of classes ({num_classes}), got {n!r}")
    if n > MAX_DENSE_NODES:
        raise InvalidInputError(f"{name}={n} is too large for a dense adjacency (at most {MAX_DENSE_NODES} nodes: "
                                f"[N, N] float32 is N^2 * 4 bytes); use a sparse generator for larger graphs")
