"""Procedurally rendered grey faces with subjects and graded pain action units (a stand-in for BioVid / StressID).

    subjects = sample_subjects(40, seed=0)                      # each with its own geometry, resting face and style
    faces = render_faces(subjects[:30], per_class=30, seed=0)   # FaceSet: images [1800, 1, 48, 48] in [0, 1]
    faces.labels                                                # [N] 0 = neutral, 1 = expressive (pain)
    faces.subjects, faces.action_units                          # [N] subject index, [N, 5] AU intensities in [0, 1]

Why it is built so: the method it serves (PFT, card pft-fer.md) needs inter-subject variability that a source model
trained on other people does not undo, and expressions that are the same across people. So:
- a subject is a geometry (face size and position, eye spacing and size, brow gap, nose and mouth place), a
  *resting face* (a neutral that already looks a little like an AU: naturally low brows, narrow eyes, a raised
  lip; these are what make a new person's neutral look "expressive" to a source model), how strongly they express
  each AU, and a rendering style (skin and background tone, hair, glasses, contrast, gamma, lighting gradient,
  blur, sensor noise);
- an expression is a vector of the PSPI pain action units AUS, each graded in [0, 1]: AU4 brow lowerer, AU6/7 eye
  narrowing (orbit tightening), AU9 nose wrinkler, AU10 upper-lip raiser, AU43 eyes closed. Neutral frames have AUs
  near 0; expressive frames have a pain intensity in [0.35, 1] spread over the AUs by the subject's gains.

Deterministic: every draw comes from numpy generators seeded by the arguments, never from a global RNG.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rankwise.errors import InvalidInputError

SIZE = 48
AUS = ("AU4_brow_lowerer", "AU6_7_eye_narrowing", "AU9_nose_wrinkler", "AU10_upper_lip_raiser", "AU43_eyes_closed")
NEUTRAL, EXPRESSIVE = 0, 1


@dataclass(frozen=True)
class FaceSubject:
    """One person: geometry (pixels), resting AUs [5], AU gains [5] and rendering style."""

    centre: tuple[float, float]  # face centre (row, col)
    radii: tuple[float, float]  # face ellipse (row, col) half-axes
    eye_row: float  # eye row offset from the centre (negative = up)
    eye_gap: float  # half-distance between the eyes
    eye_size: tuple[float, float]  # eye (row, col) half-axes when fully open
    brow_gap: float  # brow-to-eye distance at rest
    nose_len: float
    mouth_row: float  # mouth row offset from the centre
    mouth_width: float
    resting: tuple[float, ...]  # [5] AU-like offsets of this person's neutral face
    gains: tuple[float, ...]  # [5] how strongly this person expresses each AU
    skin: float
    background: float
    hair: float
    hairline: float  # rows of hair from the face top
    glasses: bool
    contrast: float
    gamma: float
    light: tuple[float, float]  # lighting gradient (row, col) per pixel
    blur: float  # gaussian sigma, pixels
    noise: float  # sensor noise std


def sample_subjects(n: int, seed: int = 0) -> list[FaceSubject]:
    """`n` subjects drawn from a generator seeded by `seed` (subject k depends on (seed, k) only)."""
    if not isinstance(n, int) or n < 1:
        raise InvalidInputError(f"n must be a positive int, got {n!r}")
    return [_subject(np.random.default_rng([seed, k, 17])) for k in range(n)]


def _subject(r: np.random.Generator) -> FaceSubject:
    u = r.uniform
    return FaceSubject(
        centre=(24 + u(-2, 2), 24 + u(-2, 2)), radii=(u(17, 21), u(13, 17)), eye_row=u(-6, -3), eye_gap=u(5, 8),
        eye_size=(u(1.8, 3.0), u(2.5, 4.0)), brow_gap=u(3.5, 5.5), nose_len=u(5, 9), mouth_row=u(9, 13),
        mouth_width=u(4, 8),
        # Resting faces overlap much of the AU range (one person's neutral brow is another's mild pain): the per-person
        # baseline that neutral-only data reveal, and that a source model cannot know for a new person.
        resting=tuple(float(v) for v in r.uniform(0, 1, 5) ** 1.5 * np.array([0.8, 0.8, 0.6, 0.6, 0.4])),
        gains=tuple(float(v) for v in r.uniform(0.5, 1.3, 5)),
        skin=u(0.45, 0.8), background=u(0.05, 0.95), hair=u(0.0, 0.35), hairline=u(3, 9), glasses=bool(r.random() < 0.3),
        contrast=u(0.6, 1.3), gamma=u(0.6, 1.6), light=(u(-0.012, 0.012), u(-0.012, 0.012)), blur=u(0.0, 1.2),
        noise=u(0.01, 0.06))


def render_face(subject: FaceSubject, action_units: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One [48, 48] float32 image in [0, 1] of `subject` showing `action_units` [5] (in [0, 1]); `rng` draws the
    frame's jitter (a pixel of head shift) and sensor noise."""
    from scipy.ndimage import gaussian_filter
    from skimage.draw import disk, ellipse, ellipse_perimeter, line, polygon

    au = np.clip(np.asarray(action_units, dtype=np.float64) + np.asarray(subject.resting), 0, 1)
    brow, narrow, wrinkle, lip, closed = au
    img = np.full((SIZE, SIZE), subject.background)
    cr, cc = subject.centre[0] + rng.uniform(-1, 1), subject.centre[1] + rng.uniform(-1, 1)
    rr, ccs = ellipse(cr, cc, subject.radii[0], subject.radii[1], shape=img.shape)
    img[rr, ccs] = subject.skin
    top = cr - subject.radii[0]
    hair_rows = rr < top + subject.hairline
    img[rr[hair_rows], ccs[hair_rows]] = subject.hair
    dark = subject.skin * 0.25
    ey = cr + subject.eye_row
    for side in (-1, 1):
        ex = cc + side * subject.eye_gap
        # AU6/7 narrow the eye from below, AU43 closes it; a closed eye is a line.
        open_ = subject.eye_size[0] * (1 - 0.65 * narrow) * (1 - closed)
        if open_ > 0.6:
            er, ec = ellipse(ey, ex, open_, subject.eye_size[1], shape=img.shape)
            img[er, ec] = 0.95
            pr, pc = disk((ey, ex), max(0.8, min(open_, 1.6)), shape=img.shape)
            img[pr, pc] = 0.05
        else:
            lr, lc = line(int(round(ey)), int(round(ex - subject.eye_size[1])), int(round(ey)), int(round(ex + subject.eye_size[1])))
            keep = (lr >= 0) & (lr < SIZE) & (lc >= 0) & (lc < SIZE)
            img[lr[keep], lc[keep]] = dark
        # AU4 lowers the brow and pulls its inner end down and in.
        by = ey - subject.brow_gap * (1 - 0.7 * brow) - subject.eye_size[0]
        inner, outer = ex - side * subject.eye_size[1] * (1 - 0.3 * brow), ex + side * (subject.eye_size[1] + 1)
        br, bc = polygon([by + 2.0 * brow, by + 2.0 * brow + 1.6, by + 1.6, by],
                         [inner, inner, outer, outer], shape=img.shape)
        img[br, bc] = dark
        if subject.glasses:
            gr, gc = ellipse_perimeter(int(round(ey)), int(round(ex)), int(subject.eye_size[0] + 3), int(subject.eye_size[1] + 2),
                                       shape=img.shape)
            img[gr, gc] = 0.1
    # Nose: a ridge; AU9 adds wrinkles across its bridge, darker with intensity.
    nr0, nr1 = int(round(ey + 2)), int(round(ey + 2 + subject.nose_len))
    for row in range(nr0, nr1 + 1):
        if 0 <= row < SIZE and 0 <= int(cc) < SIZE:
            img[row, int(cc)] = subject.skin * 0.7
    for k in range(3):
        row = int(round(ey + 1.5 + 1.3 * k))
        if wrinkle > 0.05 and 0 <= row < SIZE:
            c0, c1 = int(cc - 2.5), int(cc + 3.5)
            img[row, max(c0, 0):min(c1, SIZE)] = subject.skin * (1 - 0.6 * wrinkle)
    # Mouth: AU10 raises the upper lip (the mouth opens upward, showing a dark interior) and deepens the
    # nasolabial folds.
    my = cr + subject.mouth_row
    height = 0.6 + 3.5 * lip
    mr, mc = ellipse(my - height / 2, cc, height, subject.mouth_width, shape=img.shape)
    img[mr, mc] = 0.12
    if lip > 0.1:
        for side in (-1, 1):
            fr, fc = line(int(round(ey + subject.nose_len)), int(round(cc + side * 3)), int(round(my)), int(round(cc + side * (subject.mouth_width + 1))))
            keep = (fr >= 0) & (fr < SIZE) & (fc >= 0) & (fc < SIZE)
            img[fr[keep], fc[keep]] = subject.skin * (1 - 0.5 * lip)
    # Rendering style: lighting gradient, contrast about mid-grey, gamma, blur, sensor noise.
    rows, cols = np.mgrid[0:SIZE, 0:SIZE] - SIZE / 2
    img = img + subject.light[0] * rows + subject.light[1] * cols
    img = np.clip(0.5 + subject.contrast * (img - 0.5), 0, 1) ** subject.gamma
    if subject.blur > 0.05:
        img = gaussian_filter(img, subject.blur)
    img = img + rng.normal(0, subject.noise, img.shape)
    return np.clip(img, 0, 1).astype(np.float32)


@dataclass(frozen=True)
class FaceSet:
    """images [N, 1, 48, 48] float32 in [0, 1]; labels [N] (0 neutral, 1 expressive); subjects [N] (index into the
    subject list given); action_units [N, 5] (the expression's AUs, without the resting face)."""

    images: torch.Tensor
    labels: torch.Tensor
    subjects: torch.Tensor
    action_units: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, mask_or_index: torch.Tensor) -> FaceSet:
        return FaceSet(self.images[mask_or_index], self.labels[mask_or_index], self.subjects[mask_or_index],
                       self.action_units[mask_or_index])

    def of_subject(self, k: int, label: int | None = None) -> FaceSet:
        keep = self.subjects == k
        if label is not None:
            keep &= self.labels == label
        return self.take(keep)


def expression(subject: FaceSubject, label: int, rng: np.random.Generator) -> np.ndarray:
    """The AUs [5] of one frame: near 0 for neutral; for expressive, a pain intensity in [0.35, 1] spread over the
    AUs by the subject's gains, with per-AU jitter (people do not move every AU equally in every frame)."""
    if label == NEUTRAL:
        return np.abs(rng.normal(0, 0.04, 5))
    intensity = rng.uniform(0.35, 1.0)
    return np.clip(intensity * np.asarray(subject.gains) * rng.uniform(0.6, 1.2, 5), 0, 1)


def render_faces(subjects: list[FaceSubject], per_class: int, seed: int = 0, labels: tuple[int, ...] = (NEUTRAL, EXPRESSIVE),
                 subject_ids: list[int] | None = None) -> FaceSet:
    """`per_class` frames of each label in `labels` for every subject, ordered by subject then label; frame noise and
    expressions from generators seeded by (seed, subject id, label). `subject_ids` (default 0..) label the rows."""
    if per_class < 1:
        raise InvalidInputError(f"per_class must be at least 1, got {per_class}")
    if not subjects:
        raise InvalidInputError("render_faces needs at least one subject")
    if any(lab not in (NEUTRAL, EXPRESSIVE) for lab in labels):
        raise InvalidInputError(f"labels are {NEUTRAL} (neutral) or {EXPRESSIVE} (expressive), got {labels}")
    ids = list(range(len(subjects))) if subject_ids is None else list(subject_ids)
    if len(ids) != len(subjects):
        raise InvalidInputError(f"{len(subjects)} subjects but {len(ids)} subject ids")
    images, labs, subs, aus = [], [], [], []
    for sid, subject in zip(ids, subjects):
        for lab in labels:
            rng = np.random.default_rng([seed, sid, lab, 29])
            for _ in range(per_class):
                a = expression(subject, lab, rng)
                images.append(render_face(subject, a, rng))
                labs.append(lab)
                subs.append(sid)
                aus.append(a)
    return FaceSet(torch.from_numpy(np.stack(images))[:, None], torch.tensor(labs, dtype=torch.int64),
                   torch.tensor(subs, dtype=torch.int64), torch.from_numpy(np.stack(aus).astype(np.float32)))


__all__ = ["SIZE", "AUS", "NEUTRAL", "EXPRESSIVE", "FaceSubject", "FaceSet", "sample_subjects", "render_face", "expression",
           "render_faces"]
