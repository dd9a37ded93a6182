"""Image data from installed packages, and the transforms the vision methods apply to it (all offline).

    train = load_fashion_mnist("train")             # ImageSet: images [60000, 1, 28, 28] float32 in [0, 1], labels [60000]
    source = select_classes(train, range(5))        # classes 0-4, relabelled 0..4 (pretraining)
    target = select_classes(train, range(5, 10))    # classes 5-9, relabelled 0..4 (fine-tuning)
    small = resize(subset(train, 10_000, seed=0), 14)               # 10k images, stratified, at 14x14
    held_out = split(train, "val", seed=0)                          # a stratified 80/10/10 split
    shifted = corrupt(held_out, "blur", severity=3, seed=1)         # a test-time-adaptation domain

Sources:
- Fashion-MNIST (70,000 28x28 grey images of 10 garment classes) from Debian's `dataset-fashion-mnist`, whose
  gzipped idx files lie in `usr/share/datasets/fashion-mnist/`. Looked for, in order: `$RANKWISE_FASHION_MNIST` (that
  folder, the package folder, or a folder the .deb was extracted into), the copy `make install` extracts into the
  virtual environment (`<venv>/debian/...`), and a system-wide install (`/usr/share/datasets/fashion-mnist`). The
  parsed tensors are cached (`core.cache`, keyed by the files' sizes and modification times), so later loads skip
  the gzip and idx parse.
- scikit-learn's bundled `load_digits` (1,797 8x8 images of digits, 16 grey levels); scikit-image's bundled sample
  images (`sample_image`) and its `lfw_subset` (100 faces and 100 non-faces at 25x25).

Every function is a pure function of its arguments: splits, subsets and corruptions draw from generators seeded by
the `seed` they are given, never from the global RNG.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import os
import struct
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, save_tensors_atomic, write_bytes_atomic
from rankwise.data.splits import stratified_split
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError, UnknownNameError

ENV_VAR = "RANKWISE_FASHION_MNIST"
PACKAGE_DATA = Path("usr/share/datasets/fashion-mnist")
CACHE_NAMESPACE = "vision"
CACHE_VERSION = 1
HOW_TO_GET = ("get it with `apt-get download dataset-fashion-mnist && dpkg -x dataset-fashion-mnist_*.deb DIR` and set "
              f"{ENV_VAR}=DIR (or run `make install`, which extracts it into .venv/debian/)")
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot")
SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
SKIMAGE_IMAGES = ("astronaut", "brick", "camera", "cat", "chelsea", "coffee", "coins", "grass", "gravel", "moon", "page",
                  "rocket", "shepp_logan_phantom", "text")

# idx type codes (the third magic byte) -> big-endian numpy dtypes, as the format's definition lists them.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass(frozen=True)
class ImageSet:
    """Labelled images: `images` [N, C, H, W] float32 in [0, 1], `labels` [N] int64 in [0, len(class_names))."""

    images: torch.Tensor
    labels: torch.Tensor
    class_names: tuple[str, ...]
    name: str = ""

    def __post_init__(self) -> None:
        x, y = self.images, self.labels
        if x.dim() != 4 or x.dtype != torch.float32:
            raise InvalidInputError(f"{self.name or 'ImageSet'}: images must be float32 [N, C, H, W], got {x.dtype} {tuple(x.shape)}")
        if y.dim() != 1 or y.dtype != torch.int64 or y.numel() != x.size(0):
            raise InvalidInputError(f"{self.name or 'ImageSet'}: labels must be int64 [N] with N = {x.size(0)}, got {y.dtype} {tuple(y.shape)}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= len(self.class_names)):
            raise InvalidInputError(f"{self.name or 'ImageSet'}: labels outside 0..{len(self.class_names) - 1} "
                                    f"(the {len(self.class_names)} class names)")
        if x.numel() and not (float(x.min()) >= 0.0 and float(x.max()) <= 1.0):  # also refuses NaN
            raise InvalidInputError(f"{self.name or 'ImageSet'}: pixel values must lie in [0, 1]")

    def __len__(self) -> int:
        return int(self.labels.numel())

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def take(self, indices: torch.Tensor | Sequence[int]) -> ImageSet:
        """The images at `indices` (int64 [K], in that order) or where a bool mask [N] is True."""
        index = torch.as_tensor(indices)
        index = index.nonzero().squeeze(1) if index.dtype == torch.bool else index.long()
        return dataclasses.replace(self, images=self.images[index], labels=self.labels[index])


# ---------------------------------------------------------------------------------------------------------- idx files


def parse_idx(raw: bytes, what: str = "idx data") -> np.ndarray:
    """An idx array (the MNIST file format: magic 0x00 0x00 <type> <ndim>, ndim big-endian uint32 sizes, then the
    values big-endian, row-major) in native byte order. A wrong magic, a size that disagrees with the header (a
    truncated or padded file) raises CorruptFileError: nothing is guessed."""
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in IDX_TYPES or raw[3] == 0:
        raise CorruptFileError(f"{what} is not an idx file (magic bytes {raw[:4].hex() or 'missing'}; expected 0000 "
                               f"then a type code in {[hex(c) for c in IDX_TYPES]} and a dimension count >= 1)")
    ndim, header = raw[3], 4 + 4 * raw[3]
    if len(raw) < header:
        raise CorruptFileError(f"{what}: truncated in its header ({len(raw)} bytes for {ndim} dimension sizes)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_TYPES[raw[2]])
    expected = header + math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        raise CorruptFileError(f"{what}: {len(raw)} bytes, but its header declares {dims} values of {dtype.str} "
                               f"({expected} bytes): the file is {'truncated' if len(raw) < expected else 'padded'}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def read_idx(path: str | Path) -> np.ndarray:
    """Read an idx file, gzipped (by its magic 1f 8b, whatever its name) or not; see `parse_idx`."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; a cut stream ends in EOFError
            raise CorruptFileError(f"{path} is a damaged gzip file ({e}); reinstall it ({HOW_TO_GET})") from e
    return parse_idx(raw, str(path))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write `array` as an idx file (gzipped when the name ends in .gz), atomically. Its dtype must be one idx has."""
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in IDX_TYPES.items()}
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None or array.ndim == 0:
        raise InvalidInputError(f"idx holds arrays of at least one dimension of {sorted(str(d) for d in codes)}, not "
                                f"{array.dtype} with shape {array.shape}")
    raw = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += np.ascontiguousarray(array, dtype=np.dtype(IDX_TYPES[code])).tobytes()
    write_bytes_atomic(path, gzip.compress(raw, mtime=0) if str(path).endswith(".gz") else raw)


# ------------------------------------------------------------------------------------------------------ Fashion-MNIST


def fashion_mnist_folder() -> Path:
    """The folder with Fashion-MNIST's four .gz idx files; MissingPackageError saying how to get them if absent."""
    marker = FASHION_MNIST_FILES["train"][0]
    override = os.environ.get(ENV_VAR)
    if override:
        root = Path(override)
        for candidate in (root, root / "fashion-mnist", root / PACKAGE_DATA):
            if (candidate / marker).is_file():
                return candidate
        raise MissingPackageError(f"{ENV_VAR}={override} holds no Fashion-MNIST (no {marker} in it, its fashion-mnist/ "
                                  f"or {PACKAGE_DATA}); {HOW_TO_GET}")
    tried = [Path(sys.prefix) / "debian" / PACKAGE_DATA, Path("/") / PACKAGE_DATA]
    for candidate in tried:
        if (candidate / marker).is_file():
            return candidate
    raise MissingPackageError(f"Fashion-MNIST needs the Debian package dataset-fashion-mnist (looked in "
                              f"{', '.join(map(str, tried))}); {HOW_TO_GET}")


def load_fashion_mnist(part: str = "train", folder: str | Path | None = None, use_cache: bool = True) -> ImageSet:
    """Fashion-MNIST's official `part`, "train" (60,000 images) or "test" (10,000), as an ImageSet [N, 1, 28, 28]."""
    if part not in FASHION_MNIST_FILES:
        raise UnknownNameError(f"Fashion-MNIST has the parts {list(FASHION_MNIST_FILES)}, not {part!r}; for a validation "
                               "split use split(load_fashion_mnist('train'), 'val', seed)")
    root = Path(folder) if folder is not None else fashion_mnist_folder()
    paths = [root / f for f in FASHION_MNIST_FILES[part]]
    for p in paths:
        if not p.is_file():
            raise MissingPackageError(f"{p} does not exist; {HOW_TO_GET}")
    stats = [p.stat() for p in paths]
    key = cache_key(what=f"fashion-mnist-{part}", sizes=[s.st_size for s in stats], mtimes=[s.st_mtime_ns for s in stats],
                    version=CACHE_VERSION)
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            t = load_tensors(entry / "fashion-mnist.safetensors")
            return _fashion_mnist(t["images"], t["labels"], part)
        except (CorruptFileError, KeyError, InvalidInputError):
            pass  # readable but not this layout (another version's): parse again
    images, labels = _parse_fashion_mnist(*paths)
    if use_cache:
        store_entry(CACHE_NAMESPACE, key, lambda tmp: save_tensors_atomic(tmp / "fashion-mnist.safetensors",
                                                                          {"images": images, "labels": labels}))
    return _fashion_mnist(images, labels, part)


def _parse_fashion_mnist(images_path: Path, labels_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images [N, 28, 28] and uint8 labels [N], checked against what Fashion-MNIST is."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise CorruptFileError(f"{images_path}: expected uint8 images [N, 28, 28], found {images.dtype} {images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise CorruptFileError(f"{labels_path}: expected {images.shape[0]} uint8 labels, found {labels.dtype} {labels.shape}")
    if labels.size and labels.max() >= len(FASHION_MNIST_CLASSES):
        raise CorruptFileError(f"{labels_path}: label {int(labels.max())} outside Fashion-MNIST's classes 0..9")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.copy())


def _fashion_mnist(images: torch.Tensor, labels: torch.Tensor, part: str) -> ImageSet:
    if images.dtype != torch.uint8 or images.dim() != 3 or labels.dtype != torch.uint8 or labels.numel() != images.size(0):
        raise InvalidInputError("cached Fashion-MNIST tensors have an unexpected layout")
    return ImageSet(images.unsqueeze(1).float().div_(255.0), labels.long(), FASHION_MNIST_CLASSES, f"fashion-mnist-{part}")


# ----------------------------------------------------------------------------------------- scikit-learn, scikit-image


def load_digits_images() -> ImageSet:
    """scikit-learn's bundled digits: 1,797 images [1797, 1, 8, 8] (16 grey levels, scaled to [0, 1]), classes 0-9."""
    from sklearn.datasets import load_digits  # imported here: scikit-learn takes a second to import

    bunch = load_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    return ImageSet(images, torch.from_numpy(bunch.target.astype(np.int64)), tuple(str(d) for d in range(10)), "digits")


def load_lfw_subset() -> ImageSet:
    """scikit-image's `lfw_subset`: 100 faces then 100 non-faces (background crops), [200, 1, 25, 25]; labels
    0 = face, 1 = non-face. No identities or expressions: a face-detection set, not a recognition one."""
    from skimage import data

    raw = np.asarray(data.lfw_subset(), dtype=np.float64)
    images = torch.from_numpy(_unit_range(raw, "lfw_subset").astype(np.float32)).unsqueeze(1)
    labels = torch.cat([torch.zeros(100, dtype=torch.int64), torch.ones(raw.shape[0] - 100, dtype=torch.int64)])
    return ImageSet(images, labels, ("face", "non-face"), "lfw-subset")


def sample_image(name: str) -> torch.Tensor:
    """A scikit-image bundled sample image as float32 [C, H, W] in [0, 1] (C = 1 for grey, 3 for colour)."""
    if name not in SKIMAGE_IMAGES:
        raise UnknownNameError(f"unknown sample image {name!r}; the bundled ones are {list(SKIMAGE_IMAGES)}")
    from skimage import data

    raw = np.asarray(getattr(data, name)())
    image = _unit_range(raw, name).astype(np.float32)
    image = image[None] if image.ndim == 2 else np.moveaxis(image[..., :3], -1, 0)  # drop an alpha channel
    return torch.from_numpy(np.ascontiguousarray(image))


def _unit_range(raw: np.ndarray, what: str) -> np.ndarray:
    if raw.dtype == np.uint8:
        return raw / 255.0
    if raw.dtype == np.bool_:
        return raw.astype(np.float64)
    if raw.min() >= 0.0 and raw.max() <= 1.0:
        return raw.astype(np.float64)
    raise CorruptFileError(f"scikit-image's {what} has values outside [0, 1] ({raw.dtype}); reinstall scikit-image")


# --------------------------------------------------------------------------------------------- splits and selections


def split_indices(labels: torch.Tensor, seed: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[str, torch.Tensor]:
    """Disjoint, stratified "train", "val", "test" index sets (int64, ascending) covering every example: every
    class has within one example of its share in every part (`data.splits.stratified_split`, a pure function of
    (labels, seed, fractions))."""
    fractions = _check_fractions(fractions)
    labels = _check_labels(labels)
    return dict(zip(SPLITS, stratified_split(labels, fractions, seed)))


def split(data: ImageSet, part: str, seed: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> ImageSet:
    """One part ("train", "val" or "test") of the stratified split of `split_indices`."""
    if part not in SPLITS:
        raise UnknownNameError(f"unknown split {part!r}; the parts are {list(SPLITS)}")
    return dataclasses.replace(data.take(split_indices(data.labels, seed, fractions)[part]), name=f"{data.name}/{part}")


def select_classes(data: ImageSet, classes: Sequence[int], relabel: bool = True) -> ImageSet:
    """The images of `classes` only. With `relabel`, label `classes[i]` becomes i and the class names follow (a new
    head of len(classes) outputs); without, labels and names stay (known vs unknown classes in one label space)."""
    classes = [int(c) for c in classes]
    bad = [c for c in classes if not 0 <= c < data.num_classes]
    if not classes or bad or len(set(classes)) != len(classes):
        raise InvalidInputError(f"classes must be distinct indices in 0..{data.num_classes - 1} ({data.name}: "
                                f"{', '.join(data.class_names)}), got {classes}")
    chosen = data.take(torch.isin(data.labels, torch.tensor(classes)))
    if not relabel:
        return chosen
    mapping = torch.full((data.num_classes,), -1, dtype=torch.int64)
    mapping[torch.tensor(classes)] = torch.arange(len(classes))
    return ImageSet(chosen.images, mapping[chosen.labels], tuple(data.class_names[c] for c in classes),
                    f"{data.name}[{','.join(map(str, classes))}]")


def subset(data: ImageSet, n: int, seed: int, stratified: bool = True) -> ImageSet:
    """`n` images drawn without replacement (in their original order). `stratified`: each class gets its share of
    n, rounded by largest remainder, so class proportions stay as in `data`. A pure function of (data, n, seed)."""
    if not 1 <= n <= len(data):
        raise InvalidInputError(f"cannot take {n} images from {data.name or 'a set'} of {len(data)}: ask for 1..{len(data)}")
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    if not stratified:
        return data.take(torch.sort(order[:n]).values)
    classes, counts = torch.unique(data.labels, return_counts=True)
    quota = counts.double() * n / len(data)
    take = quota.floor().long()
    remainder = quota - take
    # ties broken by class index (stable sort), so the result does not depend on the sort algorithm
    extra = torch.sort(-remainder, stable=True).indices[: n - int(take.sum())]
    take[extra] += 1
    chosen = [order[data.labels[order] == c][:k] for c, k in zip(classes.tolist(), take.tolist())]
    return data.take(torch.sort(torch.cat(chosen)).values)


def resize_images(images: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """[N, C, H, W] -> [N, C, h, w]. Integer-factor reductions average blocks (28 -> 14: each pixel the mean of a 2x2
    block); other sizes use antialiased bilinear interpolation, whose convex weights keep values in [0, 1]."""
    h, w = (size, size) if isinstance(size, int) else size
    if h < 1 or w < 1:
        raise InvalidInputError(f"image size must be positive, got {size}")
    if images.dim() != 4:
        raise InvalidInputError(f"images must be [N, C, H, W], got {tuple(images.shape)}")
    H, W = images.shape[-2:]
    if (h, w) == (H, W):
        return images.clone()
    if H % h == 0 and W % w == 0:
        return F.avg_pool2d(images, (H // h, W // w))
    out = F.interpolate(images, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    return out.clamp_(0.0, 1.0)  # only rounding can step past the convex hull of the inputs


def resize(data: ImageSet, size: int | tuple[int, int]) -> ImageSet:
    """`data` with every image resized (see `resize_images`)."""
    return dataclasses.replace(data, images=resize_images(data.images, size))


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    f = np.asarray(list(fractions), dtype=np.float64)
    if f.shape != (3,) or (f < 0).any() or abs(f.sum() - 1.0) > 1e-9:
        raise InvalidInputError(f"fractions must be three non-negative shares of (train, val, test) summing to 1, got {list(fractions)}")
    return f


def _check_labels(labels: torch.Tensor) -> torch.Tensor:
    if labels.dim() != 1 or labels.dtype != torch.int64:
        raise InvalidInputError(f"labels must be int64 [N], got {labels.dtype} {tuple(labels.shape)}")
    return labels


# -------------------------------------------------------------------------------------------------------- corruptions

SEVERITIES = (1, 2, 3, 4, 5)
# Per severity 1..5; each row grows the distance to the clean image (to its negative for the inversion).
NOISE_STD = (0.04, 0.08, 0.12, 0.18, 0.26)
BLUR_SIGMA = (0.5, 0.75, 1.0, 1.5, 2.0)  # pixels
INVERTED_CONTRAST = (1.0, 0.8, 0.6, 0.45, 0.3)
AFFINE_ROTATION_DEG = (6.0, 12.0, 18.0, 24.0, 30.0)
AFFINE_SCALE = (0.04, 0.08, 0.12, 0.16, 0.2)  # largest relative zoom in or out
AFFINE_SHEAR = (0.04, 0.08, 0.12, 0.16, 0.2)
AFFINE_SHIFT = (0.03, 0.06, 0.09, 0.12, 0.15)  # largest shift, as a fraction of the image side


def gaussian_noise(images: torch.Tensor, severity: int, seed: int) -> torch.Tensor:
    """x + sigma z, clipped to [0, 1] (what an image sensor does); z ~ N(0, 1) is the same for every severity."""
    z = np.random.default_rng(seed).standard_normal(tuple(images.shape), dtype=np.float32)  # portable across CPUs
    return (images + NOISE_STD[severity - 1] * torch.from_numpy(z)).clamp_(0.0, 1.0)


def blur(images: torch.Tensor, severity: int, seed: int) -> torch.Tensor:
    """A separable Gaussian blur (sigma in pixels by severity), edges replicated. Deterministic: `seed` is unused."""
    del seed
    sigma = BLUR_SIGMA[severity - 1]
    radius = max(1, math.ceil(3 * sigma))
    taps = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = (kernel / kernel.sum()).float()
    n, c, h, w = images.shape
    x = images.reshape(n * c, 1, h, w)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="replicate"), kernel.view(1, 1, 1, -1))
    x = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="replicate"), kernel.view(1, 1, -1, 1))
    return x.reshape(n, c, h, w).clamp_(0.0, 1.0)  # a convex combination: only rounding can leave [0, 1]


def contrast_inversion(images: torch.Tensor, severity: int, seed: int) -> torch.Tensor:
    """The negative about mid-grey with falling contrast: 0.5 + c (0.5 - x), c from 1 (plain 1 - x) down to 0.3.
    Values stay in [0, 1]. Deterministic: `seed` is unused."""
    del seed
    return 0.5 + INVERTED_CONTRAST[severity - 1] * (0.5 - images)


def affine(images: torch.Tensor, severity: int, seed: int) -> torch.Tensor:
    """A random rotation, zoom, shear and shift per image (bilinear, zeros outside: Fashion-MNIST's background).
    Each image's directions u ~ U(-1, 1)^6 depend on `seed` only; severity scales the magnitudes."""
    n = images.size(0)
    u = torch.from_numpy(np.random.default_rng(seed).uniform(-1.0, 1.0, size=(n, 6)))
    s = severity - 1
    angle = u[:, 0] * math.radians(AFFINE_ROTATION_DEG[s])
    zoom_x, zoom_y = 1.0 + AFFINE_SCALE[s] * u[:, 1], 1.0 + AFFINE_SCALE[s] * u[:, 2]
    shear = AFFINE_SHEAR[s] * u[:, 3]
    shift = 2.0 * AFFINE_SHIFT[s] * u[:, 4:6]  # affine_grid's coordinates span [-1, 1]: a side is 2 units
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotation = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # [n, 2, 2]
    shape = torch.stack([torch.stack([zoom_x, shear * zoom_y], -1),
                         torch.stack([torch.zeros_like(shear), zoom_y], -1)], -2)
    theta = torch.cat([rotation @ shape, shift.unsqueeze(-1)], -1).float()  # maps output to input coordinates
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False).clamp_(0.0, 1.0)


CORRUPTIONS = {"gaussian_noise": gaussian_noise, "blur": blur, "contrast_inversion": contrast_inversion, "affine": affine}


def corrupt_images(images: torch.Tensor, corruption: str, severity: int, seed: int) -> torch.Tensor:
    """[N, C, H, W] in [0, 1] -> the same shape in [0, 1]: `corruption` (one of CORRUPTIONS) at `severity` 1..5, a
    pure function of (images, corruption, severity, seed)."""
    fn = CORRUPTIONS.get(corruption)
    if fn is None:
        raise UnknownNameError(f"unknown corruption {corruption!r}; the corruptions are {list(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or int(severity) not in SEVERITIES:
        raise InvalidInputError(f"severity must be an integer in 1..5 (1 mildest), got {severity!r}")
    if images.dim() != 4 or images.dtype != torch.float32:
        raise InvalidInputError(f"images must be float32 [N, C, H, W], got {images.dtype} {tuple(images.shape)}")
    return fn(images, int(severity), seed)


def corrupt(data: ImageSet, corruption: str, severity: int, seed: int) -> ImageSet:
    """`data` under `corruption` (see `corrupt_images`); labels and class names unchanged."""
    return dataclasses.replace(data, images=corrupt_images(data.images, corruption, severity, seed),
                               name=f"{data.name}/{corruption}-{severity}")
