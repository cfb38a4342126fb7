"""The JSON form of keyword arguments: one table of kinds, each written and read in its row.

The data form is JSON. JSON's null, true/false, strings and lists are None, bool, str
and list, and JSON numbers are ints of at most 64 bits; every other kind is an object
of one key, its tag, over its payload. `KINDS` is the table: a kind's row holds its
tag, the values it writes (their exact types, or a test), its encoder and its decoder,
so a kind is added in one place and the writer and the reader cannot drift (`Codec`
refuses a row that writes what nothing reads). The format, by tag (see each row):

  F float, C complex, I int beyond 64 bits, b bytes, t tuple, D dict, S set,
  Z frozenset, s NumPy scalar, a NumPy array, m masked array, d the keyword arguments;
  read only, from programs of earlier versions: f float (repr), c complex (two reprs),
  and d for str-keyed dicts among the values.

Data is exact types only: a subclass (np.str_ of str aside, which is a NumPy scalar),
an object dtype or long double (whose bits differ between platforms) are not data.

Rows marked `local` are written only in this process's encoding, which leaves it as a
digest (see the package's "H" blobs) and is never decoded: h a large array, o a value
that is not data, n a namedtuple, r a container met again inside itself (a cycle).
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .copies import copy_array, is_namedtuple, masked
from .dtypes import NotData, dtype_code, dtype_from, smallest_normal
from .held import described, pickle_digest

__all__ = ["CODEC", "KINDS", "KWARGS", "Codec", "Encoder", "Kind", "NotData", "dumps", "loads"]

# NumPy arrays larger than this are named by a digest of their contents in the
# encoding that calls in this process use (exports carry the data itself).
INLINE_BYTES = 4096
# Python ints in this range are JSON numbers; others are hex (no limit on digits).
_JSON_INTS = range(-(2**63), 2**64)


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of value in the encoding: its row of the table.

    tag: the key of its JSON object, or None where JSON writes it itself.
    types: the exact types it writes; `when` chooses among rows of one type. A row
      without types is chosen by `when` for any value that no type names, or by name
      (the encoder's own use: the keyword arguments, a cycle, a value that is not data).
    encode: (encoder, value, path) -> payload, the JSON under the tag; None for a kind
      read only (an earlier version wrote it).
    decode: payload -> value; None only for a `local` kind, never decoded.
    """

    name: str
    tag: str | None
    types: tuple[type, ...] = ()
    when: Callable[[Encoder, Any], bool] | None = None
    encode: Callable[[Encoder, Any, str], Any] | None = None
    decode: Callable[[Any], Any] | None = None
    local: bool = False


class Codec:
    """The table of kinds, checked: every kind that leaves this process can be read back.

    `by_type`: the rows of each exact type, in order (`only`: the row of a type that has
    one, always chosen); `tested`: the rows chosen by `when` alone; `decoders`: the
    decoder of each tag.
    """

    def __init__(self, kinds: Iterable[Kind]):
        self.kinds = tuple(kinds)
        self.by_type: dict[type, tuple[Kind, ...]] = {}
        self.decoders: dict[str, Callable[[Any], Any]] = {}
        tags: set[str] = set()
        for kind in self.kinds:
            what = f"jaxbind: keyword-argument kind {kind.name!r}"
            if kind.local and (kind.decode is not None or kind.tag is None or not kind.encode):
                raise ValueError(f"{what}: a local kind is written under a tag, never decoded")
            if not kind.local and kind.decode is None:
                raise ValueError(
                    f"{what}: nothing reads what it writes{_under(kind)}; give it a decoder, "
                    "or mark it local (written only in this process's digests)"
                )
            if kind.encode is None and kind.types:
                raise ValueError(f"{what} has types but no encoder")
            if kind.tag in tags:
                raise ValueError(f"jaxbind: keyword-argument tag {kind.tag!r} is taken twice")
            if kind.tag is not None:
                tags.add(kind.tag)
                if kind.decode is not None:
                    self.decoders[kind.tag] = kind.decode
            for kind_type in kind.types:
                self.by_type[kind_type] = (*self.by_type.get(kind_type, ()), kind)
        self.tested = tuple(k for k in self.kinds if not k.types and k.when is not None)
        self.only = {t: k for t, (k, *more) in self.by_type.items() if not more and not k.when}


def _under(kind: Kind) -> str:
    return "" if kind.tag is None else f" under {kind.tag!r}"


class Encoder:
    """Writes values by the table: exact for data, by identity for the rest.

    `large`: a list, to name large arrays by digests (and collect them), or None for
    the data in full. `local`: a list, to encode values that are not data as o (and
    collect them), or None to raise NotData. `where` names the op in messages.
    """

    def __init__(self, large: list | None, local: list | None, where: str = ""):
        self.large = large
        self.local = local
        self.where = where
        self.open: dict[int, str] = {}  # the containers being encoded: id -> path
        self.cycles = False  # a container was met inside itself

    def kind_of(self, value) -> Kind:
        """The row that writes `value` (OTHER where no row does)."""
        for kind in CODEC.by_type.get(type(value), CODEC.tested):
            if kind.when is None or kind.when(self, value):
                return kind
        return OTHER

    def write(self, kind: Kind, value, path: str):
        payload = kind.encode(self, value, path)  # type: ignore[misc]
        return payload if kind.tag is None else {kind.tag: payload}

    def encode(self, value, path: str):
        kind = _ONLY.get(type(value)) or self.kind_of(value)
        try:
            payload = kind.encode(self, value, path)  # type: ignore[misc]
        except NotData:  # an object dtype, say (from no container: they encode items)
            if self.local is None or kind is OTHER:
                raise
            kind, payload = OTHER, _other(self, value, path)
        return payload if kind.tag is None else {kind.tag: payload}

    def items(self, values, path: str) -> list:
        if id(values) in self.open:
            return self.write(CYCLE, values, path)
        self.open[id(values)] = path
        try:
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(values)]
        finally:
            del self.open[id(values)]

    def pairs(self, value: dict, path: str) -> list:
        if id(value) in self.open:
            return self.write(CYCLE, value, path)
        self.open[id(value)] = path
        pairs = []
        try:
            for k, v in value.items():
                where = f"{path}[{k!r}]"
                self.hashable(k, f"{where} (its key)")
                pairs.append([self.encode(k, f"{where} (its key)"), self.encode(v, where)])
        finally:
            del self.open[id(value)]
        return pairs

    def unordered(self, values, path: str) -> list:
        items = []
        for v in values:
            self.hashable(v, f"{path} (an element)")
            items.append(self.encode(v, f"{path} (an element)"))
        return sorted(items, key=dumps)

    def hashable(self, value, path: str) -> None:
        if subnormal(value):
            raise TypeError(
                f"jaxbind: {self.where}: keyword argument '{path}' is, or holds, the "
                f"subnormal float {value!r}. XLA runs callables on threads that read "
                "subnormal floats as zero, where such a dict key or set element would "
                "be taken for another (0, False) when the callable's copy is made. Use it "
                "as a value rather than a key, or scale it"
            )


def dumps(obj) -> str:
    """The JSON text of an encoding (compact: its bytes are what programs carry)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def loads(text: str | bytes) -> Any:
    """The values of a JSON text made by dumps (data only: nothing in it runs code)."""
    return from_data(json.loads(text))


def from_data(obj):
    if isinstance(obj, list):
        return [from_data(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    ((tag, payload),) = obj.items()
    decode = CODEC.decoders.get(tag)
    if decode is None:
        raise ValueError(f"jaxbind: unknown tag {tag!r} in encoded keyword arguments")
    return decode(payload)


# --- the rows' encoders and decoders --------------------------------------------------


def _itself(encoder: Encoder, value, path: str):
    return value


def _int(encoder: Encoder, value: int, path: str):
    return value if value in _JSON_INTS else encoder.write(BIG_INT, value, path)


def _float_bits(value: float) -> str:
    return struct.pack("<d", value).hex()  # exact: -0.0, and nan's sign and payload too


def _bits_float(text: str) -> float:
    return struct.unpack("<d", bytes.fromhex(text))[0]


def _distinct(payload: list, decoded):
    """`decoded`, a dict or set, if it kept every key of `payload`."""
    if len(decoded) != len(payload):
        raise ValueError(
            "jaxbind: encoded keyword arguments hold a dict or set whose keys are not "
            "distinct once decoded"
        )
    return decoded


def _array(encoder: Encoder, value: np.ndarray, path: str, large: bool = False):
    """[dtype, shape, base64 of its bytes, "F" where in Fortran order]; for a `large`
    one, [dtype, shape, SHA-256 of its bytes, order]."""
    dtype = dtype_code(value.dtype, path)
    if value.dtype.itemsize == 0:
        raise NotData(f"{path}: NumPy dtype {value.dtype} has no bytes")
    order: Literal["C", "F"] = "F" if np.isfortran(value) else "C"
    value = copy_array(value, always=False)
    if large:
        encoder.large.append(value)  # type: ignore[union-attr]
        flat = (value.T if order == "F" else np.ascontiguousarray(value)).reshape(-1)
        digest = hashlib.sha256(flat.view(np.uint8).data).hexdigest()
        return [dtype, list(value.shape), digest, order]
    payload = [dtype, list(value.shape), base64.b64encode(value.tobytes(order=order)).decode()]
    return payload + ["F"] if order == "F" else payload


def _array_from(payload) -> np.ndarray:
    dtype, shape, data, *order = payload
    raw = np.frombuffer(bytearray(base64.b64decode(data)), dtype=dtype_from(dtype))
    return raw.reshape(shape, order="F" if order == ["F"] else "C")  # a writable view


def _scalar(encoder: Encoder, value: np.generic, path: str):
    """[dtype, [], base64 of its bytes]"""
    array = copy_array(np.asarray(value), always=False)
    if type(value) is not array.dtype.type:
        raise NotData(f"{path}: {type(value).__name__} is not plain data")
    if array.dtype.itemsize == 0:
        raise NotData(f"{path}: NumPy dtype {array.dtype} has no bytes")
    return [dtype_code(array.dtype, path), [], base64.b64encode(array.tobytes()).decode()]


def _scalar_from(payload) -> Any:  # a NumPy scalar
    dtype, _, data = payload
    return np.frombuffer(base64.b64decode(data), dtype=dtype_from(dtype)).reshape(())[()]


def _masked(encoder: Encoder, value: np.ma.MaskedArray, path: str):
    """[data (an a), its mask (an a) or None for nomask, its fill value (a 0-d a) or
    None for NumPy's default, hard mask]"""
    if value.baseclass is not np.ndarray:
        raise NotData(f"{path}: a masked {value.baseclass.__name__} is not plain data")

    def array(part: np.ndarray, where: str):  # an a, or in this process an h
        return encoder.write(encoder.kind_of(part), part, where)

    mask = np.ma.getmask(value)
    # the fill value as set (None: NumPy's default, made when first asked for), as
    # NumPy's own pickle of a masked array keeps it
    fill = value._fill_value  # type: ignore[attr-defined]
    return [
        array(value.data, path),
        None if mask is np.ma.nomask else array(np.asarray(mask), f"{path}.mask"),
        None if fill is None else array(fill, f"{path}.fill_value"),
        bool(value.hardmask),
    ]


def _masked_from(payload) -> np.ma.MaskedArray:
    data, mask, fill, hard = payload
    mask = np.ma.nomask if mask is None else _array_from(mask["a"])
    fill = None if fill is None else _array_from(fill["a"])
    return masked(_array_from(data["a"]), mask, fill, bool(hard))


def _namedtuple(encoder: Encoder, value, path: str):
    """[id of its class, [fields]]"""
    encoder.local.append(value)  # type: ignore[union-attr]
    return [id(type(value)), encoder.items(value, path)]


def _cycle(encoder: Encoder, value, path: str):
    """The path where the container was first met."""
    first = encoder.open[id(value)]
    if encoder.local is None:
        raise NotData(
            f"{path} is {first} itself: {first} holds itself, a cycle, which plain data "
            "cannot hold (pass it without the reference to itself)"
        )
    encoder.local.append(value)  # (held in this process, with the whole keyword argument)
    encoder.cycles = True
    return first


def _other(encoder: Encoder, value, path: str):
    """[id, digest of its pickle] (see held)."""
    if encoder.local is None:
        raise NotData(f"{path}: {described(value)} is not plain data")
    digest = pickle_digest(value, path, encoder.where)
    encoder.local.append(value)
    return [id(value), digest]


_DOUBLE_MIN = 2.2250738585072014e-308  # the smallest normal double


def subnormal(value) -> bool:
    """Whether `value` (a dict key, a set element) is or holds a subnormal float."""
    kind = type(value)
    if kind is float:
        return 0.0 < abs(value) < _DOUBLE_MIN
    if kind is complex:
        return subnormal(value.real) or subnormal(value.imag)
    if isinstance(value, np.generic):
        tiny = smallest_normal(value.dtype)
        if tiny is None:
            return False
        parts: tuple[Any, ...] = (value.real, value.imag) if value.dtype.kind == "c" else (value,)
        return any(0 < abs(part) < tiny for part in parts)
    if kind in (tuple, frozenset) or is_namedtuple(value):
        return any(subnormal(item) for item in value)
    return False


# --- the table ------------------------------------------------------------------------

KWARGS = Kind(  # [[name, value], ...] by name; read also for str-keyed dicts (earlier versions)
    "keyword arguments",
    "d",
    encode=lambda e, items, p: [[name, e.encode(value, name)] for name, value in items],
    decode=lambda p: {k: from_data(v) for k, v in p},
)
BIG_INT = Kind("big int", "I", encode=lambda e, v, p: hex(v), decode=lambda p: int(p, 16))
CYCLE = Kind("cycle", "r", encode=_cycle, local=True)
OTHER = Kind("not data", "o", encode=_other, local=True)

KINDS: tuple[Kind, ...] = (
    Kind("None, bool, str", None, (type(None), bool, str), encode=_itself, decode=lambda p: p),
    Kind("int", None, (int,), encode=_int, decode=lambda p: p),  # at most 64 bits
    BIG_INT,
    Kind("float", "F", (float,), encode=lambda e, v, p: _float_bits(v), decode=_bits_float),
    Kind(
        "complex",
        "C",  # [real, imag], each an F
        (complex,),
        encode=lambda e, v, p: [_float_bits(v.real), _float_bits(v.imag)],
        decode=lambda p: complex(_bits_float(p[0]), _bits_float(p[1])),
    ),
    Kind(
        "bytes",
        "b",  # base64
        (bytes,),
        encode=lambda e, v, p: base64.b64encode(v).decode(),
        decode=base64.b64decode,
    ),
    Kind("list", None, (list,), encode=Encoder.items, decode=lambda p: [from_data(v) for v in p]),
    Kind("tuple", "t", (tuple,), encode=Encoder.items, decode=lambda p: tuple(map(from_data, p))),
    Kind(
        "dict",
        "D",  # [[key, value], ...] in the dict's order, keys encoded as values are
        (dict,),
        encode=Encoder.pairs,
        decode=lambda p: _distinct(p, {from_data(k): from_data(v) for k, v in p}),
    ),
    Kind(
        "set",
        "S",  # elements in the order of their encodings
        (set,),
        encode=Encoder.unordered,
        decode=lambda p: _distinct(p, {from_data(v) for v in p}),
    ),
    Kind(
        "frozenset",
        "Z",
        (frozenset,),
        encode=Encoder.unordered,
        decode=lambda p: _distinct(p, frozenset(from_data(v) for v in p)),
    ),
    Kind(
        "large array",
        "h",  # over INLINE_BYTES, in this process: named by a digest of its bytes
        (np.ndarray,),
        when=lambda e, v: e.large is not None and v.nbytes > INLINE_BYTES,
        encode=lambda e, v, p: _array(e, v, p, large=True),
        local=True,
    ),
    Kind("array", "a", (np.ndarray,), encode=_array, decode=_array_from),
    Kind("masked array", "m", (np.ma.MaskedArray,), encode=_masked, decode=_masked_from),
    Kind(
        "NumPy scalar",
        "s",
        when=lambda e, v: isinstance(v, np.generic),
        encode=_scalar,
        decode=_scalar_from,
    ),
    Kind(
        "namedtuple",
        "n",
        when=lambda e, v: e.local is not None and is_namedtuple(v),
        encode=_namedtuple,
        local=True,
    ),
    KWARGS,
    CYCLE,
    OTHER,
    Kind("float (earlier versions)", "f", decode=float),  # its repr
    Kind("complex (earlier versions)", "c", decode=lambda p: complex(float(p[0]), float(p[1]))),
)

CODEC = Codec(KINDS)
_ONLY = CODEC.only  # (the encoder's first look, once per value)
