"""A reader of R's serialization format (XDR binary, versions 2 and 3) and of R's lazy-load databases, without R.

R packages ship their datasets as a lazy-load database: `data/Rdata.rdx` is a compressed serialized index (a list
with `variables`: name -> c(offset, length) into `data/Rdata.rdb`, plus `references` and `compressed`), and each
record of `Rdata.rdb` is a 4-byte big-endian uncompressed length followed by a zlib stream (compression type 1;
types 2 and 3 add one byte naming the codec: 'Z' zlib, '2' bzip2, 'X' xz, '0' stored) holding one serialized object.

    db = LazyLoadDB("dslabs/data")          # the folder with Rdata.rdx / Rdata.rdb
    frame = data_frame(db.load("movielens"))   # column name -> numpy array (numbers) or list of str/None

What is read (R's `serialize.c`): NILSXP, symbols, pairlists (with attributes and tags), CHARSXP with their encoding
flags and NA_STRING, logical/integer/double/complex/string/raw vectors (long lengths too), generic lists (VECSXP),
expression vectors, attributes on any of them, reference back-ids (symbols and environments enter the table), the
global/base/empty environments as markers, and R 3.5's compact integer/real sequences (ALTREP). Closures,
environments with contents, bytecode, promises and S4 objects are refused with an `InvalidInputError`: datasets do
not hold them. A truncated or garbled stream raises `CorruptFileError`. Nothing is evaluated: it is plain parsing.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rankwise.errors import CorruptFileError, InvalidInputError

# SEXP types (Rinternals.h) and the serializer's pseudo-types (serialize.c).
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, VECSXP, EXPRSXP, BCODESXP, RAWSXP, S4SXP = 9, 10, 13, 14, 15, 16, 19, 20, 21, 24, 25
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP = 255, 254, 253, 252, 251, 250
NAMESPACESXP, PACKAGESXP, PERSISTSXP, EMPTYENV_SXP, BASEENV_SXP, ATTRLANGSXP, ATTRLISTSXP, ALTREP_SXP = 249, 248, 247, 242, 241, 240, 239, 238
NA_INTEGER = -(2**31)  # also NA for logicals
# CHARSXP encoding bits in the `levels` field of the flags.
LATIN1_MASK, UTF8_MASK, BYTES_MASK, ASCII_MASK = 1 << 2, 1 << 3, 1 << 1, 1 << 6

_TYPE_NAMES = {NILSXP: "NULL", SYMSXP: "symbol", LISTSXP: "pairlist", CLOSXP: "closure", ENVSXP: "environment",
               PROMSXP: "promise", LANGSXP: "language", CHARSXP: "char", LGLSXP: "logical", INTSXP: "integer",
               REALSXP: "double", CPLXSXP: "complex", STRSXP: "character", VECSXP: "list", EXPRSXP: "expression",
               BCODESXP: "bytecode", RAWSXP: "raw", S4SXP: "S4", PERSISTSXP: "persistent reference",
               BASENAMESPACE_SXP: "base namespace", NAMESPACESXP: "namespace", PACKAGESXP: "package environment"}


@dataclass(frozen=True)
class RSymbol:
    name: str


@dataclass(frozen=True)
class REnvironment:
    """A marker for an environment (global, base, empty): its contents are never needed by a dataset."""

    name: str


@dataclass
class RObject:
    """One R value. `value` by type: NULL None; symbol RSymbol; logical/integer an int32 array (NA_INTEGER for NA);
    double a float64 array; complex a complex128 array; character a list of str (None for NA); raw bytes; list and
    expression a list of RObject; pairlist and language a list of (tag or None, RObject)."""

    type: int
    value: Any
    attributes: dict[str, RObject] = field(default_factory=dict)

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(self.type, f"type {self.type}")

    def attr(self, name: str) -> Any:
        """The value of attribute `name`, or None."""
        a = self.attributes.get(name)
        return None if a is None else a.value

    @property
    def classes(self) -> list[str]:
        return [c for c in (self.attr("class") or []) if c is not None]

    def __len__(self) -> int:
        return 0 if self.value is None else len(self.value)


NULL = RObject(NILSXP, None)


class _Reader:
    """Parses one serialized stream (after its 'X\\n' format marker)."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what
        self.refs: list[Any] = []

    # -- primitives -----------------------------------------------------------------------------------------------
    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise CorruptFileError(f"{self.what}: the serialized data ends early (needed {n} bytes at offset {self.pos} "
                                   f"of {len(self.data)}); the file is truncated or corrupt")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def length(self) -> int:
        n = self.int()
        if n == -1:  # a long vector: the length follows as two 32-bit halves
            hi, lo = struct.unpack(">II", self.take(8))
            n = (hi << 32) + lo
        if n < 0:
            raise CorruptFileError(f"{self.what}: negative vector length {n} at offset {self.pos}")
        if n > len(self.data):  # every element takes at least one byte: a larger length is garbage
            raise CorruptFileError(f"{self.what}: vector length {n} exceeds the data ({len(self.data)} bytes)")
        return n

    # -- items ----------------------------------------------------------------------------------------------------
    def item(self) -> Any:
        flags = self.int()
        kind, levels = flags & 0xFF, flags >> 12
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind == NILVALUE_SXP:
            return NULL
        if kind in (GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP):
            return REnvironment({GLOBALENV_SXP: "global", EMPTYENV_SXP: "empty", BASEENV_SXP: "base"}[kind])
        if kind in (UNBOUNDVALUE_SXP, MISSINGARG_SXP):
            return REnvironment("unbound" if kind == UNBOUNDVALUE_SXP else "missing")
        if kind == REFSXP:
            index = flags >> 8 or self.int()
            if not 1 <= index <= len(self.refs):
                raise CorruptFileError(f"{self.what}: reference #{index} but only {len(self.refs)} objects were seen")
            return self.refs[index - 1]
        if kind == SYMSXP:
            name = self.item()
            if not isinstance(name, RObject) or name.type != CHARSXP or name.value is None:
                raise CorruptFileError(f"{self.what}: a symbol's name is not a string")
            sym = RSymbol(name.value)
            self.refs.append(sym)
            return sym
        if kind == CHARSXP:
            return RObject(CHARSXP, self.charsxp(levels))
        if kind in (LISTSXP, LANGSXP, ATTRLISTSXP, ATTRLANGSXP):
            return self.pairlist(kind, has_attr, has_tag)
        if kind in (LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, VECSXP, EXPRSXP, RAWSXP):
            obj = RObject(kind, self.vector(kind))
        elif kind == ALTREP_SXP:
            obj = self.altrep()
        else:
            name = _TYPE_NAMES.get(kind, f"SEXP type {kind}")
            raise InvalidInputError(f"{self.what}: holds an R {name} (type {kind}), which this reader does not support "
                                    "(it reads data: vectors, lists, data frames and factors)")
        if has_attr:
            obj.attributes = self.attributes()
        return obj

    def charsxp(self, levels: int) -> str | None:
        n = self.int()
        if n == -1:
            return None  # NA_STRING
        raw = self.take(n)
        encoding = "latin-1" if levels & LATIN1_MASK else "utf-8"
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            if levels & (UTF8_MASK | ASCII_MASK):
                raise CorruptFileError(f"{self.what}: a string flagged UTF-8/ASCII is not valid UTF-8: {raw[:40]!r}") from None
            return raw.decode("latin-1")  # native or "bytes" encoding: keep every byte, never guess silently wrong

    def vector(self, kind: int) -> Any:
        n = self.length()
        if kind in (LGLSXP, INTSXP):
            return np.frombuffer(self.take(4 * n), dtype=">i4").astype(np.int32)
        if kind == REALSXP:
            return np.frombuffer(self.take(8 * n), dtype=">f8").astype(np.float64)
        if kind == CPLXSXP:
            parts = np.frombuffer(self.take(16 * n), dtype=">f8").astype(np.float64)
            return parts[0::2] + 1j * parts[1::2]
        if kind == RAWSXP:
            return self.take(n)
        if kind == STRSXP:
            out = []
            for _ in range(n):
                s = self.item()
                if not isinstance(s, RObject) or s.type != CHARSXP:
                    raise CorruptFileError(f"{self.what}: a character vector holds a non-string element")
                out.append(s.value)
            return out
        return [self.item() for _ in range(n)]  # VECSXP, EXPRSXP

    def pairlist(self, kind: int, has_attr: bool, has_tag: bool) -> RObject:
        """A pairlist or call, read iteratively along its CDR chain (a long attribute list must not recurse deeply)."""
        base = LANGSXP if kind in (LANGSXP, ATTRLANGSXP) else LISTSXP
        attributes = self.attributes() if has_attr else {}
        cells: list[tuple[str | None, Any]] = []
        while True:
            tag = self.item() if has_tag else None
            if has_tag and not isinstance(tag, RSymbol):
                tag = None if tag is NULL else tag
            cells.append((tag.name if isinstance(tag, RSymbol) else None, self.item()))
            flags = self.int()
            nxt = flags & 0xFF
            if nxt == NILVALUE_SXP:
                break
            if nxt not in (LISTSXP, LANGSXP, ATTRLISTSXP, ATTRLANGSXP):
                self.pos -= 4  # an improper list's CDR: read it as the last cell's value
                cells.append((None, self.item()))
                break
            has_tag = bool(flags & (1 << 10))
            if flags & (1 << 9):
                self.attributes()  # attributes on inner cells carry nothing a dataset uses
        return RObject(base, cells, attributes)

    def attributes(self) -> dict[str, RObject]:
        attrs = self.item()
        if not isinstance(attrs, RObject) or attrs.type != LISTSXP:
            raise CorruptFileError(f"{self.what}: attributes are not a pairlist")
        return {tag or "": value for tag, value in attrs.value}

    def altrep(self) -> RObject:
        info, state, attr = self.item(), self.item(), self.item()
        cls = info.value[0][1] if isinstance(info, RObject) and info.type == LISTSXP and info.value else None
        name = cls.name if isinstance(cls, RSymbol) else "?"
        if name in ("compact_intseq", "compact_realseq") and isinstance(state, RObject) and len(state) == 3:
            n, start, step = (float(v) for v in state.value)
            values = start + step * np.arange(int(n), dtype=np.float64)
            obj = RObject(INTSXP, values.astype(np.int32)) if name == "compact_intseq" else RObject(REALSXP, values)
        elif name.startswith("wrap_") and isinstance(state, RObject) and state.type == VECSXP and state.value:
            obj = state.value[0]  # a wrapper around its payload (the second element holds metadata)
        elif name == "deferred_string" and isinstance(state, RObject) and state.type == LISTSXP and state.value:
            source = state.value[0][1]
            obj = RObject(STRSXP, [_format_number(v) for v in source.value])
        else:
            raise InvalidInputError(f"{self.what}: holds an ALTREP object of class {name!r}, which this reader does not support")
        if isinstance(attr, RObject) and attr.type == LISTSXP:
            obj.attributes = {tag or "": value for tag, value in attr.value}
        return obj


def _format_number(v: Any) -> str | None:
    if isinstance(v, (int, np.integer)):
        return None if v == NA_INTEGER else str(int(v))
    return None if math.isnan(v) else repr(float(v))


def unserialize(data: bytes, what: str = "R data") -> RObject:
    """Parse one serialized R object (`serialize(x, NULL)` / the payload of an .rds file). XDR versions 2 and 3."""
    if data[:2] != b"X\n":
        kind = {b"A\n": "ASCII", b"B\n": "native binary"}.get(data[:2])
        if kind:
            raise InvalidInputError(f"{what}: R serialization in {kind} format is not supported (only XDR binary, R's default)")
        raise CorruptFileError(f"{what}: not R serialized data (starts with {data[:8]!r}, expected the 'X\\n' XDR marker)")
    reader = _Reader(data, what)
    reader.take(2)
    version = reader.int()
    if version not in (2, 3):
        raise InvalidInputError(f"{what}: R serialization version {version} is not supported (versions 2 and 3 are)")
    reader.take(8)  # the writer's R version and the oldest R version that can read it
    if version == 3:
        reader.take(reader.int())  # the native encoding of the writing session (strings carry their own flags)
    obj = reader.item()
    if not isinstance(obj, RObject):
        raise InvalidInputError(f"{what}: the top-level object is {obj!r}, not data")
    return obj


def decompress(data: bytes, what: str) -> bytes:
    """The payload of an .rds-style file: gzip, bzip2, xz or uncompressed, told apart by the magic bytes."""
    try:
        if data[:2] == b"\x1f\x8b":
            return gzip.decompress(data)
        if data[:3] == b"BZh":
            return bz2.decompress(data)
        if data[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(data)
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError) as e:
        raise CorruptFileError(f"{what}: the compressed stream is damaged ({e})") from e
    return data


def read_rds(path: str | Path) -> RObject:
    """An .rds file (saveRDS), or any compressed serialized R object such as a lazy-load index (.rdx)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"{path}: no such file")
    return unserialize(decompress(path.read_bytes(), str(path)), str(path))


def read_record(blob: bytes, compressed: int, what: str) -> bytes:
    """One record of a lazy-load .rdb file: the serialized bytes it holds."""
    if len(blob) < 4:
        raise CorruptFileError(f"{what}: a lazy-load record of {len(blob)} bytes is too short")
    size = struct.unpack(">I", blob[:4])[0]
    body, codec = blob[4:], "Z"
    if compressed in (2, 3):
        codec, body = chr(blob[4]) if len(blob) > 4 else "?", blob[5:]
    try:
        if codec == "Z":
            out = zlib.decompress(body)
        elif codec == "2":
            out = bz2.decompress(body)
        elif codec == "X":
            out = lzma.decompress(body)
        elif codec == "0":
            out = body
        else:
            raise CorruptFileError(f"{what}: unknown lazy-load compression {codec!r}")
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
        raise CorruptFileError(f"{what}: the compressed record is damaged ({e})") from e
    if len(out) != size:
        raise CorruptFileError(f"{what}: the record decompresses to {len(out)} bytes, its header says {size}")
    return out


class LazyLoadDB:
    """An R lazy-load database: `<prefix>.rdx` (the index) and `<prefix>.rdb` (the records).

    `folder` is the package's `data/` folder (prefix `Rdata`) or the path prefix itself (`.../Rdata`).
    """

    def __init__(self, folder: str | Path, prefix: str = "Rdata") -> None:
        folder = Path(folder)
        base = folder / prefix if folder.is_dir() else folder
        self.rdx, self.rdb = base.with_suffix(".rdx"), base.with_suffix(".rdb")
        for f in (self.rdx, self.rdb):
            if not f.is_file():
                raise InvalidInputError(f"{f}: missing; an R lazy-load database needs both {self.rdx.name} and {self.rdb.name}")
        index = read_rds(self.rdx)
        if index.type != VECSXP or not isinstance(index.attr("names"), list):
            raise CorruptFileError(f"{self.rdx}: not a lazy-load index (a named list expected, got an R {index.type_name})")
        parts = dict(zip(index.attr("names"), index.value))
        variables = parts.get("variables")
        if variables is None or variables.type != VECSXP:
            raise CorruptFileError(f"{self.rdx}: the index has no 'variables' list")
        compressed = parts.get("compressed")
        self.compressed = int(compressed.value[0]) if compressed is not None and len(compressed) else 1
        self.offsets: dict[str, tuple[int, int]] = {}
        for name, where in zip(variables.attr("names") or [], variables.value):
            if where.type not in (INTSXP, REALSXP) or len(where) != 2:
                raise CorruptFileError(f"{self.rdx}: the entry of {name!r} is not (offset, length)")
            self.offsets[name] = (int(where.value[0]), int(where.value[1]))

    def names(self) -> list[str]:
        return sorted(self.offsets)

    def load(self, name: str) -> RObject:
        if name not in self.offsets:
            raise InvalidInputError(f"{self.rdb}: no dataset {name!r}; it holds {self.names()}")
        offset, length = self.offsets[name]
        with open(self.rdb, "rb") as f:
            f.seek(offset)
            blob = f.read(length)
        what = f"{self.rdb} [{name}]"
        if len(blob) != length:
            raise CorruptFileError(f"{what}: the record at offset {offset} is cut short ({len(blob)} of {length} bytes)")
        return unserialize(read_record(blob, self.compressed, what), what)


def column_values(col: RObject, what: str) -> np.ndarray | list[str | None]:
    """A data-frame column as Python data: a factor becomes its labels (None for NA), logicals stay int32 with
    NA_INTEGER, numbers a numpy array, strings a list."""
    if "factor" in col.classes:
        levels = col.attr("levels")
        if col.type != INTSXP or not isinstance(levels, list):
            raise CorruptFileError(f"{what}: a factor without integer codes and a levels vector")
        codes = col.value
        if codes.size and (codes[codes != NA_INTEGER].max(initial=1) > len(levels) or codes[codes != NA_INTEGER].min(initial=1) < 1):
            raise CorruptFileError(f"{what}: factor codes outside 1..{len(levels)}")
        return [None if c == NA_INTEGER else levels[c - 1] for c in codes.tolist()]
    if col.type in (LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP):
        return col.value
    raise InvalidInputError(f"{what}: a column of R type {col.type_name} is not supported")


def data_frame(obj: RObject, what: str = "R data") -> dict[str, np.ndarray | list[str | None]]:
    """The columns of an R data.frame (a named list of equal-length vectors with class "data.frame")."""
    if obj.type != VECSXP or "data.frame" not in obj.classes:
        raise InvalidInputError(f"{what}: not a data.frame (an R {obj.type_name} of class {obj.classes or 'none'})")
    names = obj.attr("names")
    if not isinstance(names, list) or len(names) != len(obj.value):
        raise CorruptFileError(f"{what}: a data.frame whose names do not match its {len(obj.value)} columns")
    columns = {str(n): column_values(c, f"{what} column {n!r}") for n, c in zip(names, obj.value)}
    rows = data_frame_rows(obj)
    for n, c in columns.items():
        if len(c) != rows:
            raise CorruptFileError(f"{what}: column {n!r} has {len(c)} values, the frame {rows} rows")
    return columns


def data_frame_rows(obj: RObject) -> int:
    """The row count, from `row.names`: R stores automatic row names compactly as c(NA, -n) (or c(NA, n))."""
    rn = obj.attributes.get("row.names")
    if rn is None:
        return len(obj.value[0]) if obj.value else 0
    if rn.type == INTSXP and len(rn) == 2 and rn.value[0] == NA_INTEGER:
        return abs(int(rn.value[1]))
    return len(rn)
