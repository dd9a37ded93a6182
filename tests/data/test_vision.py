"""Image data (rankwise.data.vision): the idx reader on files written here, Fashion-MNIST from a fake package
folder (and from the real one when it is unpacked), splits, subsets, resizing and corruptions."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from rankwise.data import vision
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError, UnknownNameError


def fake_fashion_mnist(folder, n_train=40, n_test=20, seed=0):
    """A tiny Fashion-MNIST package folder: uint8 images [n, 28, 28] and balanced labels 0-9, gzipped idx files."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for part, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        names = vision.FASHION_MNIST_FILES[part]
        vision.write_idx(folder / names[0], images)
        vision.write_idx(folder / names[1], labels)
        arrays[part] = (images, labels)
    return arrays


def labelled(n_per_class=(30, 20, 10), size=8, seed=0):
    """An ImageSet with uneven classes (for stratification checks) and random pixels."""
    labels = torch.cat([torch.full((k,), c, dtype=torch.int64) for c, k in enumerate(n_per_class)])
    perm = torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(seed))
    images = torch.rand(labels.numel(), 1, size, size, generator=torch.Generator().manual_seed(seed + 1))
    return vision.ImageSet(images, labels[perm], tuple(f"c{c}" for c in range(len(n_per_class))), "toy")


# ------------------------------------------------------------------------------------------------------- idx files


@pytest.mark.parametrize("array", [
    np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
    np.array([-5, 0, 7], dtype=np.int8),
    np.array([[1, -70000], [3, 2**30]], dtype=np.int32),
    np.array([1.5, -2.25e-3, np.pi], dtype=np.float32),
    np.array([[np.e]], dtype=np.float64),
    np.array([[-3], [300]], dtype=np.int16),
])
@pytest.mark.parametrize("name", ["a.idx", "a.idx.gz"])
def test_idx_round_trip(tmp_path, array, name):
    vision.write_idx(tmp_path / name, array)
    back = vision.read_idx(tmp_path / name)
    assert back.dtype == array.dtype.newbyteorder("=") and back.shape == array.shape
    assert np.array_equal(back, array)
    raw = (tmp_path / name).read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")


def test_idx_header_layout_is_big_endian(tmp_path):
    vision.write_idx(tmp_path / "x.idx", np.array([[1, 2, 3]], dtype=np.int32))
    raw = (tmp_path / "x.idx").read_bytes()
    assert raw[:4] == b"\x00\x00\x0c\x02" and raw[4:12] == b"\x00\x00\x00\x01\x00\x00\x00\x03"
    assert raw[12:16] == b"\x00\x00\x00\x01"  # values big-endian too


def test_damaged_idx_files_are_refused(tmp_path):
    vision.write_idx(tmp_path / "good.idx", np.zeros((3, 28, 28), dtype=np.uint8))
    raw = (tmp_path / "good.idx").read_bytes()
    cases = {
        "truncated": raw[:-1],
        "padded": raw + b"\x00",
        "cut header": raw[:9],
        "wrong magic": b"\x00\x01" + raw[2:],
        "unknown type": raw[:2] + b"\x07" + raw[3:],
        "no dimensions": raw[:3] + b"\x00",
        "empty": b"",
    }
    for what, data in cases.items():
        with pytest.raises(CorruptFileError):
            vision.parse_idx(data, what)
    (tmp_path / "cut.gz").write_bytes(gzip.compress(raw)[:-12])  # a gzip stream cut short
    with pytest.raises(CorruptFileError, match="damaged gzip"):
        vision.read_idx(tmp_path / "cut.gz")
    (tmp_path / "short.gz").write_bytes(gzip.compress(raw[:-5]))  # a whole gzip of a truncated idx file
    with pytest.raises(CorruptFileError, match="truncated"):
        vision.read_idx(tmp_path / "short.gz")
    with pytest.raises(InvalidInputError):
        vision.write_idx(tmp_path / "bad.idx", np.zeros(3, dtype=np.uint64))


# -------------------------------------------------------------------------------------------------- Fashion-MNIST


def test_fashion_mnist_from_a_package_folder(tmp_path, tmp_cache, monkeypatch):
    arrays = fake_fashion_mnist(tmp_path / "usr/share/datasets/fashion-mnist")
    monkeypatch.setenv(vision.ENV_VAR, str(tmp_path))  # the folder a .deb was extracted into
    train = vision.load_fashion_mnist("train")
    images, labels = arrays["train"]
    assert train.images.shape == (40, 1, 28, 28) and train.images.dtype == torch.float32
    assert torch.equal(train.images[:, 0], torch.from_numpy(images).float() / 255)
    assert torch.equal(train.labels, torch.from_numpy(labels).long())
    assert train.class_names == vision.FASHION_MNIST_CLASSES and train.name == "fashion-mnist-train"
    assert len(vision.load_fashion_mnist("test")) == 20
    with pytest.raises(UnknownNameError, match="'train', 'test'"):
        vision.load_fashion_mnist("val")


def test_fashion_mnist_cache_hit_and_corrupted_entry_rebuilt(tmp_path, tmp_cache, monkeypatch):
    fake_fashion_mnist(tmp_path)
    monkeypatch.setenv(vision.ENV_VAR, str(tmp_path))
    parses = []
    real_parse = vision._parse_fashion_mnist
    monkeypatch.setattr(vision, "_parse_fashion_mnist", lambda *a: parses.append(a) or real_parse(*a))
    first = vision.load_fashion_mnist("train")  # a miss: parsed and stored
    second = vision.load_fashion_mnist("train")  # a hit: not parsed again
    assert len(parses) == 1 and torch.equal(first.images, second.images) and torch.equal(first.labels, second.labels)
    (entry,) = (tmp_cache / vision.CACHE_NAMESPACE).iterdir()
    blob = entry / "fashion-mnist.safetensors"
    raw = bytearray(blob.read_bytes())
    raw[-100] ^= 0xFF  # one flipped byte in a pixel
    blob.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        third = vision.load_fashion_mnist("train")
    assert len(parses) == 2 and torch.equal(third.images, first.images)
    assert len(vision.load_fashion_mnist("train", use_cache=False)) == 40 and len(parses) == 3


def test_fashion_mnist_with_wrong_contents_is_refused(tmp_path, tmp_cache):
    fake_fashion_mnist(tmp_path)
    images_file, labels_file = (tmp_path / f for f in vision.FASHION_MNIST_FILES["train"])
    vision.write_idx(labels_file, np.arange(39, dtype=np.uint8) % 10)  # 39 labels for 40 images
    with pytest.raises(CorruptFileError, match="40 uint8 labels"):
        vision.load_fashion_mnist("train", folder=tmp_path)
    vision.write_idx(labels_file, np.full(40, 10, dtype=np.uint8))
    with pytest.raises(CorruptFileError, match="label 10"):
        vision.load_fashion_mnist("train", folder=tmp_path)
    vision.write_idx(images_file, np.zeros((40, 27, 27), dtype=np.uint8))
    with pytest.raises(CorruptFileError, match=r"\[N, 28, 28\]"):
        vision.load_fashion_mnist("train", folder=tmp_path)


def test_missing_package_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(vision.ENV_VAR, str(tmp_path))
    with pytest.raises(MissingPackageError, match="apt-get download dataset-fashion-mnist"):
        vision.load_fashion_mnist()


def test_real_fashion_mnist(tmp_cache):
    try:
        folder = vision.fashion_mnist_folder()
    except MissingPackageError as e:
        pytest.skip(f"dataset-fashion-mnist is not unpacked here ({e}); `make install` does it")
    train, test = vision.load_fashion_mnist("train", folder), vision.load_fashion_mnist("test", folder)
    assert train.images.shape == (60_000, 1, 28, 28) and len(test) == 10_000
    assert train.labels.bincount().tolist() == [6000] * 10 and test.labels.bincount().tolist() == [1000] * 10
    assert float(train.images.min()) == 0.0 and float(train.images.max()) == 1.0
    # a trouser is taller than wide: its bright pixels span more rows than columns (a check on the image layout)
    trousers = train.images[train.labels == 1][:200, 0] > 0.2
    assert float(trousers.any(2).sum(1).float().mean()) > float(trousers.any(1).sum(1).float().mean())


# ---------------------------------------------------------------------------------------- bundled sklearn / skimage


def test_bundled_images():
    digits = vision.load_digits_images()
    assert digits.images.shape == (1797, 1, 8, 8) and digits.num_classes == 10
    assert float(digits.images.max()) == 1.0 and float(digits.images.min()) == 0.0
    faces = vision.load_lfw_subset()
    assert faces.images.shape == (200, 1, 25, 25) and faces.labels.bincount().tolist() == [100, 100]
    camera, astronaut = vision.sample_image("camera"), vision.sample_image("astronaut")
    assert camera.shape == (1, 512, 512) and astronaut.shape == (3, 512, 512)
    assert 0.0 <= float(astronaut.min()) and float(astronaut.max()) <= 1.0
    with pytest.raises(UnknownNameError, match="camera"):
        vision.sample_image("lena")


def test_image_set_validates_its_tensors():
    with pytest.raises(InvalidInputError, match="float32"):
        vision.ImageSet(torch.zeros(2, 1, 4, 4, dtype=torch.float64), torch.zeros(2, dtype=torch.int64), ("a",))
    with pytest.raises(InvalidInputError, match="labels outside"):
        vision.ImageSet(torch.zeros(2, 1, 4, 4), torch.tensor([0, 1]), ("a",))
    with pytest.raises(InvalidInputError, match=r"\[0, 1\]"):
        vision.ImageSet(torch.full((2, 1, 4, 4), 1.5), torch.tensor([0, 0]), ("a",))


# ------------------------------------------------------------------------------------------- splits and selections


def test_split_is_deterministic_disjoint_complete_and_stratified():
    data = labelled()
    parts = vision.split_indices(data.labels, seed=3)
    again = vision.split_indices(data.labels, seed=3)
    assert all(torch.equal(parts[k], again[k]) for k in vision.SPLITS)
    everything = torch.cat([parts[k] for k in vision.SPLITS])
    assert torch.equal(torch.sort(everything).values, torch.arange(len(data)))  # disjoint and complete
    for name, share in zip(vision.SPLITS, vision.DEFAULT_FRACTIONS):
        counts = torch.bincount(data.labels[parts[name]], minlength=3)
        expected = torch.bincount(data.labels, minlength=3).double() * share
        assert bool(((counts - expected).abs() <= 1).all()), (name, counts, expected)
    other = vision.split_indices(data.labels, seed=4)
    assert not torch.equal(other["val"], parts["val"])
    val = vision.split(data, "val", seed=3)
    assert torch.equal(val.images, data.images[parts["val"]]) and val.name == "toy/val"


def test_split_refuses_bad_arguments():
    data = labelled()
    with pytest.raises(UnknownNameError, match="'train', 'val', 'test'"):
        vision.split(data, "validation", seed=0)
    with pytest.raises(InvalidInputError, match="summing to 1"):
        vision.split_indices(data.labels, 0, (0.5, 0.3, 0.3))
    with pytest.raises(InvalidInputError, match="int64"):
        vision.split_indices(data.labels.int(), 0)


def test_select_classes():
    data = labelled((5, 6, 7, 8))
    picked = vision.select_classes(data, [3, 1])
    assert len(picked) == 14 and picked.class_names == ("c3", "c1")
    assert picked.labels.bincount().tolist() == [8, 6]  # class 3 -> 0, class 1 -> 2nd
    assert torch.equal(picked.images[picked.labels == 0], data.images[data.labels == 3])
    kept = vision.select_classes(data, range(2), relabel=False)
    assert kept.class_names == data.class_names and set(kept.labels.tolist()) == {0, 1}
    for bad in ([4], [-1], [], [1, 1]):
        with pytest.raises(InvalidInputError, match="0..3"):
            vision.select_classes(data, bad)


def test_subset_by_count():
    data = labelled((30, 20, 10))
    small = vision.subset(data, 12, seed=0)
    assert len(small) == 12 and small.labels.bincount().tolist() == [6, 4, 2]
    assert torch.equal(vision.subset(data, 12, seed=0).images, small.images)
    assert not torch.equal(vision.subset(data, 12, seed=1).images, small.images)
    odd = vision.subset(data, 7, seed=0)  # 3.5, 2.33, 1.17 -> 4, 2, 1 by largest remainder
    assert odd.labels.bincount().tolist() == [4, 2, 1]
    assert len(vision.subset(data, 60, seed=0, stratified=False)) == 60
    for n in (0, 61):
        with pytest.raises(InvalidInputError, match="1..60"):
            vision.subset(data, n, seed=0)


def test_resize():
    data = labelled(size=28)
    half = vision.resize(data, 14)
    blocks = data.images.reshape(-1, 1, 14, 2, 14, 2).mean((3, 5))
    torch.testing.assert_close(half.images, blocks, rtol=0, atol=2 * torch.finfo(torch.float32).eps)
    odd = vision.resize(data, (16, 20)).images
    assert odd.shape == (60, 1, 16, 20) and 0.0 <= float(odd.min()) and float(odd.max()) <= 1.0
    with pytest.raises(InvalidInputError, match="positive"):
        vision.resize(data, 0)


# ----------------------------------------------------------------------------------------------------- corruptions


def test_corruptions_are_deterministic_graded_and_in_range():
    digits = vision.resize(vision.load_digits_images(), 28)
    x = digits.images[:256]
    for name in vision.CORRUPTIONS:
        reference = 1 - x if name == "contrast_inversion" else x  # the inversion is graded away from the negative
        distances = []
        for severity in vision.SEVERITIES:
            y = vision.corrupt_images(x, name, severity, seed=5)
            assert y.shape == x.shape and y.dtype == torch.float32
            assert 0.0 <= float(y.min()) and float(y.max()) <= 1.0
            assert torch.equal(y, vision.corrupt_images(x, name, severity, seed=5)), name
            distances.append(float((y - reference).abs().mean()))
        assert all(a < b for a, b in zip(distances, distances[1:])), (name, distances)
    for name in ("gaussian_noise", "affine"):  # the random ones depend on the seed
        assert not torch.equal(vision.corrupt_images(x, name, 3, seed=5), vision.corrupt_images(x, name, 3, seed=6))
    shifted = vision.corrupt(digits, "blur", 2, seed=0)
    assert torch.equal(shifted.labels, digits.labels) and shifted.name == "digits/blur-2"


def test_corruptions_refuse_bad_arguments():
    x = torch.rand(2, 1, 8, 8)
    for severity in (0, 6, 2.5, True):
        with pytest.raises(InvalidInputError, match="1..5"):
            vision.corrupt_images(x, "blur", severity, seed=0)
    with pytest.raises(UnknownNameError, match="gaussian_noise"):
        vision.corrupt_images(x, "fog", 1, seed=0)
    with pytest.raises(InvalidInputError, match="float32"):
        vision.corrupt_images(x.double(), "blur", 1, seed=0)
