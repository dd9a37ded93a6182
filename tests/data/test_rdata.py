"""The R serialization reader (rankwise.data.rdata) on streams written here byte by byte, and on the real dslabs data."""

import gzip
import struct
import zlib

import numpy as np
import pytest

from rankwise.data import rdata
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError

pytestmark = pytest.mark.method("peso")


# -- a minimal XDR writer (R's serialize.c layout) ------------------------------------------------------------------
def i32(*v):
    return b"".join(struct.pack(">i", x) for x in v)


def flags(kind, attr=False, tag=False, obj=False, levels=0):
    return i32(kind | (obj << 8) | (attr << 9) | (tag << 10) | (levels << 12))


def charsxp(s, levels=1 << 3):
    if s is None:
        return flags(9) + i32(-1)
    raw = s.encode("latin-1" if levels & (1 << 2) else "utf-8")
    return flags(9, levels=levels) + i32(len(raw)) + raw


def sym(name):
    return flags(1) + charsxp(name)


def ref(index):
    return i32((index << 8) | 255)


def strsxp(values, attrs=b""):
    return flags(16, attr=bool(attrs)) + i32(len(values)) + b"".join(charsxp(v) for v in values) + attrs


def intsxp(values, attrs=b"", long=False):
    n = i32(-1) + struct.pack(">II", 0, len(values)) if long else i32(len(values))
    return flags(13, attr=bool(attrs)) + n + i32(*values) + attrs


def realsxp(values, attrs=b""):
    return flags(14, attr=bool(attrs)) + i32(len(values)) + b"".join(struct.pack(">d", v) for v in values) + attrs


def pairlist(cells):
    """cells: (tag bytes, value bytes); tags as symbols or references."""
    out = b""
    for tag, value in cells:
        out += flags(2, tag=True) + tag + value
    return out + flags(254)


def stream(body, version=3):
    head = b"X\n" + i32(version, 0x040100, 0x030500)
    if version == 3:
        head += i32(5) + b"UTF-8"
    return head + body


def movie_frame():
    """data.frame(id = 1:3, title = c("Alien", NA, "Amélie"), genre = factor(c("b", "a", "b")), rating = c(4, 3.5, 5)),
    with symbols reused through reference back-ids, as R writes them."""
    # the reference table fills in order of first appearance: 1 levels, 2 class, 3 names, 4 row.names
    genre = flags(13, attr=True, obj=True) + i32(3) + i32(2, 1, 2) + pairlist([
        (sym("levels"), strsxp(["a", "b"])), (sym("class"), strsxp(["factor"]))])
    columns = [intsxp([1, 2, 3]), strsxp(["Alien", None, "Amélie"]), genre, realsxp([4.0, 3.5, 5.0])]
    attrs = pairlist([(sym("names"), strsxp(["id", "title", "genre", "rating"])),
                      (ref(2), strsxp(["data.frame"])),
                      (sym("row.names"), intsxp([rdata.NA_INTEGER, -3]))])
    return flags(19, attr=True, obj=True) + i32(4) + b"".join(columns) + attrs


def test_data_frame_with_factor_na_string_and_references():
    obj = rdata.unserialize(stream(movie_frame()))
    assert obj.classes == ["data.frame"]
    frame = rdata.data_frame(obj)
    assert list(frame) == ["id", "title", "genre", "rating"]
    assert frame["id"].tolist() == [1, 2, 3] and frame["rating"].tolist() == [4.0, 3.5, 5.0]
    assert frame["title"] == ["Alien", None, "Amélie"]  # NA_STRING -> None, UTF-8 decoded
    assert frame["genre"] == ["b", "a", "b"]  # factor codes through levels
    assert rdata.data_frame_rows(obj) == 3


def test_version_2_latin1_long_vectors_and_compact_sequences():
    body = flags(19) + i32(3) + (flags(16) + i32(1) + charsxp("café", levels=1 << 2)) + intsxp([7, 8], long=True)
    # ALTREP compact_intseq 5:9 = info (class symbol, package symbol, type), state c(n, start, step), no attributes
    info = flags(2) + sym("compact_intseq") + (flags(2) + sym("base") + (flags(2) + intsxp([13]) + flags(254)))
    body += flags(238) + info + realsxp([5.0, 5.0, 1.0]) + flags(254)
    obj = rdata.unserialize(stream(body, version=2))
    latin, long, seq = obj.value
    assert latin.value == ["café"]
    assert long.value.tolist() == [7, 8]
    assert seq.type == rdata.INTSXP and seq.value.tolist() == [5, 6, 7, 8, 9]


def test_nil_logical_na_and_symbols():
    body = flags(19) + i32(3) + flags(254) + (flags(10) + i32(2) + i32(1, rdata.NA_INTEGER)) + sym("x")
    obj = rdata.unserialize(stream(body))
    assert obj.value[0] is rdata.NULL
    assert obj.value[1].value.tolist() == [1, rdata.NA_INTEGER]
    assert obj.value[2] == rdata.RSymbol("x")


def test_corrupt_and_unsupported_streams_are_clear_errors():
    good = stream(movie_frame())
    with pytest.raises(CorruptFileError, match="ends early"):
        rdata.unserialize(good[: len(good) // 2])
    with pytest.raises(CorruptFileError, match="not R serialized data"):
        rdata.unserialize(b"PK\x03\x04 a zip file")
    with pytest.raises(InvalidInputError, match="ASCII"):
        rdata.unserialize(b"A\n3\n")
    with pytest.raises(InvalidInputError, match="version 4"):
        rdata.unserialize(b"X\n" + i32(4, 0, 0))
    with pytest.raises(InvalidInputError, match="closure"):
        rdata.unserialize(stream(flags(3) + b"\x00" * 16))
    with pytest.raises(CorruptFileError, match="reference #7"):
        rdata.unserialize(stream(ref(7)))
    with pytest.raises(InvalidInputError, match="not a data.frame"):
        rdata.data_frame(rdata.unserialize(stream(intsxp([1]))))


def _lazy_db(folder, objects, damage=None):
    rdb, index = b"", []
    for name, body in objects.items():
        payload = stream(body)
        record = struct.pack(">I", len(payload)) + zlib.compress(payload)
        if damage == name:
            record = record[:6] + b"\xff\xff" + record[8:]
        index.append((name, len(rdb), len(record)))
        rdb += record
    variables = flags(19, attr=True) + i32(len(index)) + b"".join(intsxp([o, n]) for _, o, n in index) + pairlist(
        [(sym("names"), strsxp([n for n, _, _ in index]))])
    rdx = flags(19, attr=True) + i32(3) + variables + (flags(19) + i32(0)) + (flags(10) + i32(1) + i32(1)) + pairlist(
        [(sym("names"), strsxp(["variables", "references", "compressed"]))])
    (folder / "Rdata.rdb").write_bytes(rdb)
    (folder / "Rdata.rdx").write_bytes(gzip.compress(stream(rdx)))


def test_lazy_load_database_round_trip_and_damage(tmp_path):
    _lazy_db(tmp_path, {"movies": movie_frame(), "numbers": realsxp([1.5, 2.5])})
    db = rdata.LazyLoadDB(tmp_path)
    assert db.names() == ["movies", "numbers"]
    assert rdata.data_frame(db.load("movies"))["genre"] == ["b", "a", "b"]
    assert db.load("numbers").value.tolist() == [1.5, 2.5]
    with pytest.raises(InvalidInputError, match="no dataset 'other'"):
        db.load("other")
    _lazy_db(tmp_path, {"movies": movie_frame()}, damage="movies")
    with pytest.raises(CorruptFileError, match="damaged"):
        rdata.LazyLoadDB(tmp_path).load("movies")
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(b"garbage")[:-6])
    with pytest.raises(CorruptFileError):
        rdata.LazyLoadDB(tmp_path)


def test_missing_package_says_how_to_get_it(tmp_path, monkeypatch):
    from rankwise.data import ratings

    monkeypatch.setenv(ratings.ENV_VAR, str(tmp_path))
    with pytest.raises(MissingPackageError, match="apt-get download r-cran-dslabs"):
        ratings.load_movielens()


def test_real_dslabs_movielens(tmp_path, monkeypatch):
    from rankwise.data import ratings

    try:
        folder = ratings.dslabs_data_folder()
    except MissingPackageError as e:
        pytest.skip(f"r-cran-dslabs is not unpacked here ({e}); `make install` does it")
    monkeypatch.setenv("RANKWISE_CACHE", str(tmp_path / "cache"))
    r = ratings.load_movielens(folder)
    assert (len(r), r.num_users, r.num_items) == (100_004, 671, 9_066)
    assert bool((r.timestamp[1:] >= r.timestamp[:-1]).all())
    assert r.rating.min() == 0.5 and r.rating.max() == 5.0
    assert "Toy Story (1995)" in r.titles or "Toy Story" in r.titles
    again = ratings.load_movielens(folder)  # from the cache: the same tensors
    assert np.array_equal(again.item.numpy(), r.item.numpy()) and again.titles == r.titles
    with pytest.raises(InvalidInputError, match="unknown item"):
        ratings.check_known(r.user[:3], torch_tensor([0, r.num_items + 2, 1]), r.num_users, r.num_items)


def torch_tensor(values):
    import torch

    return torch.tensor(values)
