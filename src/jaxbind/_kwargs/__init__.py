"""Keyword arguments of a call: encoded once at trace time, decoded once per call site.

Keyword arguments given to a jaxbind op at call time are static: they become
part of the compiled program. They are encoded to bytes (the bytes are what the
jit cache and the program's attributes see) and decoded back into a
`KwargsDump`, which is what callables receive as their third argument and what
`load_kwargs` turns into a fresh dict.

A callable receives exactly what was passed: the same types (a NumPy float64 stays
one, an IntEnum is not an int), dtypes, shapes, bits and masks. Data (see `_Encoder`)
is encoded as data, which exported programs carry; any other value is held in this
process, named by its identity and a digest of its pickle: plain jit runs it,
jax.export refuses it. A value that is neither data nor picklable is refused. A list or
dict that holds itself (a cycle) is held in this process too, its cycle kept in every copy.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import pickle
import struct
import weakref
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Literal

import jax
import jax.export  # a submodule: not loaded by "import jax"
import numpy as np

__all__ = ["KwargsDump", "data_blob", "encode_kwargs", "load_kwargs", "localized"]

# First byte of an encoded blob says how the rest is encoded:
#   J  data-only JSON (see _Encoder); safe to decode from any program or artifact.
#   H  a digest naming keyword arguments held in this process only (they could
#      not be encoded as data); never decoded from bytes, so never exportable.
_DATA_TAG = b"J"
_LOCAL_TAG = b"H"
# digest blob -> kwargs that are not data. Weakly held: an entry lives as long
# as something uses it (a CallSpec in a jaxpr or cache, a compiled program,
# which keeps it through the lowering's keepalives, or a resolved call site).
_local: weakref.WeakValueDictionary[bytes, KwargsDump] = weakref.WeakValueDictionary()


class NotData(TypeError):
    """A value that the data-only encoding cannot represent."""


class KwargsDump:
    """Keyword arguments of one call site, as handed to callables.

    Opaque to callables: turn it into a dict with `jaxbind.load_kwargs`.
    Equal blobs compare and hash equal, so equal keyword arguments hit the
    same jit cache entry.
    """

    __slots__ = ("blob", "_values", "_cycles", "__weakref__")

    def __init__(self, blob: bytes, values: Mapping[str, Any], cycles: bool = False):
        self.blob = blob
        self._values = values
        self._cycles = cycles  # a value holds itself: copied by _copied

    def __eq__(self, other):
        return isinstance(other, KwargsDump) and other.blob == self.blob

    def __hash__(self):
        return hash(self.blob)

    def __repr__(self):
        return "{" + ", ".join(f"{k}={_short(v)}" for k, v in self._values.items()) + "}"

    def to_dict(self) -> dict[str, Any]:
        """A fresh copy of the keyword arguments, as they were passed.

        Callers may change it: dicts, lists and sets in it are new at every call (tuples
        are rebuilt where they hold one), so no change reaches a later call or another
        binding. NumPy arrays are shared, read-only; other objects are the objects
        that were passed (never a lookalike: see encode_kwargs).
        """
        if self._cycles:
            memo: dict = {}
            return {k: _copied(v, lambda leaf: leaf, memo) for k, v in self._values.items()}
        return {name: _fresh(value) for name, value in self._values.items()}

    def names(self) -> tuple[str, ...]:
        """The names of the keyword arguments."""
        return tuple(self._values)

    def with_extra(self, **extra) -> KwargsDump:
        """This dump plus `extra` entries (e.g. batch_axes)."""
        if not extra:
            return self
        return encode_kwargs({**self._values, **extra})


def _is_namedtuple(value) -> bool:
    """A namedtuple (no instance dict): a value like a tuple, of a class of the user's."""
    return (
        isinstance(value, tuple)
        and hasattr(type(value), "_fields")
        and not hasattr(value, "__dict__")
    )


def _fresh(value):
    """`value` with its dicts, lists and sets copied, all the way down (leaves are shared)."""
    # This runs where the callable runs: on XLA's threads, which read subnormal floats as
    # zero. Dicts and sets are copied with their stored hashes (no key is hashed again but
    # to replace a value; see _subnormal).
    kind = type(value)
    if kind in _SHARED:
        return value
    if kind is dict:
        fresh = value.copy()
        for k, v in value.items():
            if type(v) in _COPIED or isinstance(v, tuple):
                fresh[k] = _fresh(v)
        return fresh
    if kind is list:
        return [_fresh(v) for v in value]
    if isinstance(value, tuple):
        if (kind is tuple or _is_namedtuple(value)) and any(
            type(v) in _COPIED or isinstance(v, tuple) for v in value
        ):
            return tuple.__new__(kind, [_fresh(v) for v in value])
        return value
    if kind is set:
        return value.copy()  # its elements are hashable: nothing in them to copy
    return value


_COPIED = (dict, list, set)
_SHARED = frozenset((type(None), bool, int, float, complex, str, bytes, np.ndarray))


def _copied(value, leaf: Callable, memo: dict):
    """`value` with its dicts, lists, sets and tuples copied and `leaf` of anything else,
    each cycle kept (`memo`: id -> copy): for keyword arguments that hold themselves, in
    which _fresh and _frozen_copy would go round forever."""
    if id(value) in memo:
        return memo[id(value)]
    kind = type(value)
    if kind is list:
        items: list = []
        memo[id(value)] = items
        items.extend(_copied(v, leaf, memo) for v in value)
        return items
    if kind is dict:  # (its keys: hashable, no subnormal float among them: see hashable)
        pairs: dict = {}
        memo[id(value)] = pairs
        pairs.update((k, _copied(v, leaf, memo)) for k, v in value.items())
        return pairs
    if kind is tuple or _is_namedtuple(value):  # (a cycle through it goes through a list)
        copies = [_copied(v, leaf, memo) for v in value]
        return memo.setdefault(id(value), tuple.__new__(kind, copies))
    return set(value) if kind is set else leaf(value)


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"{type(value).__name__}{value.shape}:{value.dtype}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _frozen_copy(value):
    """`value` with every NumPy array in it (through tuples, lists, dicts) replaced by a
    read-only copy: every call site shares decoded kwargs, and the caller's own
    arrays are never touched. Other objects are kept as they are: the encoding named
    them by identity (see _Encoder)."""
    kind = type(value)
    if kind is np.ndarray:
        return _freeze(_copy(value))
    if kind is np.ma.MaskedArray and value.baseclass is np.ndarray:
        mask = np.ma.getmask(value)
        return _freeze(
            _masked(
                _copy(value.data),
                mask if mask is np.ma.nomask else _copy(mask),
                None if value._fill_value is None else value._fill_value.copy(),
                value.hardmask,
            )
        )
    if kind is tuple or _is_namedtuple(value):
        return tuple.__new__(kind, [_frozen_copy(item) for item in value])
    if kind is list:
        return [_frozen_copy(item) for item in value]
    if kind is dict:
        return {key: _frozen_copy(item) for key, item in value.items()}
    if kind is set:
        return set(value)
    return value


def _copy(array: np.ndarray, *, always: bool = True) -> np.ndarray:
    """A copy of `array` in its order (Fortran order stays Fortran order), the padding of
    a structured dtype zeros: NumPy's copies leave padding undefined, so it is no part
    of the value, and equal values encode alike. Without `always`, an array that has no
    padding to clear is itself."""
    if array.dtype.names is None:
        return array.copy(order="A") if always else array
    clean = np.zeros(array.shape, array.dtype, order="F" if np.isfortran(array) else "C")
    clean[...] = array
    return clean


def _freeze(value):
    """Make arrays that jaxbind itself made read-only (they are its own copies)."""
    kind = type(value)
    if kind is np.ndarray:
        value.setflags(write=False)
    elif kind is np.ma.MaskedArray:
        value.setflags(write=False)
        mask = np.ma.getmask(value)
        if mask is not np.ma.nomask:
            mask.setflags(write=False)
    elif kind in (list, tuple) or _is_namedtuple(value):
        for item in value:
            _freeze(item)
    elif kind is dict:
        for item in value.values():
            _freeze(item)
    return value


def _masked(data, mask, fill_value, hard_mask) -> np.ma.MaskedArray:
    """A masked array of exactly these parts (an all-False mask stays an array)."""
    return np.ma.MaskedArray(
        data, mask=mask, fill_value=fill_value, hard_mask=hard_mask, shrink=False, copy=False
    )


# NumPy arrays larger than this are named by a digest of their contents in the
# encoding that calls in this process use (exports carry the data itself).
_INLINE_BYTES = 4096
# Python ints in this range are JSON numbers; others are hex (no limit on digits).
_JSON_INTS = range(-(2**63), 2**64)


class _Encoder:
    """The JSON form of keyword arguments, exact for data, by identity for the rest.

    The data form is JSON. JSON's null, true/false, strings and lists are None, bool,
    str and list, and JSON numbers are ints of at most 64 bits; everything else is an
    object of one key, its tag:

      F  float: its 8 bytes in hex (exact: -0.0, and nan's sign and payload too)
      C  complex: [real, imag], each an F
      I  int beyond 64 bits: hex
      b  bytes: base64
      t  tuple; S set, Z frozenset (elements in the order of their encodings); D dict:
         [[key, value], ...] in the dict's order, keys encoded as values are
      s  NumPy scalar: [dtype, [], base64 of its bytes]
      a  NumPy array: [dtype, shape, base64 of its bytes, "F" where in Fortran order]
      m  masked array: [data (an a), its mask (an a) or None for nomask, its fill
         value (a 0-d a) or None for NumPy's default, hard mask]
      d  the keyword arguments: [[name, value], ...] by name
    read only, from programs of earlier versions: f float (repr), c complex (two reprs),
    and d for str-keyed dicts among the values.

    A dtype is its .str ("<f8", "|S3", "<M8[s]"), an ml_dtypes name ("bfloat16"),
    [dtype, shape] for a subarray, or {names, formats, offsets, itemsize[, titles,
    aligned]} for a structured one. Data is exact types only: a subclass (np.str_ of
    str aside, which is a NumPy scalar), an object dtype or long double (whose bits
    differ between platforms) are not data.

    Only in this process's encoding (never decoded; such a blob is a digest, "H"):

      h  a large array (over _INLINE_BYTES): [dtype, shape, SHA-256 of its bytes, order]
      o  a value that is not data: [id, digest of its pickle]; the dump holds the value
         itself, so the id stays its own (two objects that pickle alike, a plan or a
         handle whose state lives outside its pickle, are still two objects), and the
         pickle tells a changed object from the one traced
      n  a namedtuple: [id of its class, [fields]]
      r  a list, tuple or dict met again inside itself (a cycle): the path where it was
         first met

    `large`: a list, to name large arrays by digests (and collect them), or None for
    the data in full. `local`: a list, to encode values that are not data as o (and
    collect them), or None to raise NotData.
    """

    def __init__(self, large: list | None, local: list | None, where: str = ""):
        self.large = large
        self.local = local
        self.where = where
        self.open: dict[int, str] = {}  # the containers being encoded: id -> path
        self.cycles = False

    def encode(self, value, path: str):
        encode = _ENCODE.get(type(value))
        try:
            if encode is not None:
                return encode(self, value, path)
            if isinstance(value, np.generic):
                return _scalar(value, path)
            if type(value) is np.ma.MaskedArray:
                return self.masked(value, path)
        except NotData:  # an object dtype, say (from no container: they encode items)
            if self.local is None:
                raise
            return self.other(value, path)
        if self.local is not None and _is_namedtuple(value):
            self.local.append(value)
            return {"n": [id(type(value)), self.items(value, path)]}
        return self.other(value, path)

    def other(self, value, path: str):
        if self.local is None:
            raise NotData(f"{path}: {_described(value)} is not plain data")
        _check_static(path, value, self.where)
        try:
            pickled = pickle.dumps(value, protocol=4)
        except Exception as exc:
            raise TypeError(
                f"jaxbind: {self.where}: keyword arguments must be plain data or picklable, "
                f"and '{path}' ({type(value).__name__}) is neither: "
                f"{type(exc).__name__}: {exc}. Pass data (numbers, strings, NumPy arrays, "
                "tuples, lists, dicts of them), make the value picklable, or hand it to "
                "the callable another way (functools.partial, a closure)"
            ) from None
        self.local.append(value)
        return {"o": [id(value), hashlib.blake2b(pickled, digest_size=16).hexdigest()]}

    def items(self, values, path: str) -> list:
        if id(values) in self.open:
            return self.cycle(values, path)
        self.open[id(values)] = path
        try:
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(values)]
        finally:
            del self.open[id(values)]

    def cycle(self, value, path: str):
        first = self.open[id(value)]
        if self.local is None:
            raise NotData(
                f"{path} is {first} itself: {first} holds itself, a cycle, which plain data "
                "cannot hold (pass it without the reference to itself)"
            )
        self.local.append(value)  # (held in this process, with the whole keyword argument)
        self.cycles = True
        return {"r": first}

    def unordered(self, values, path: str) -> list:
        items = []
        for v in values:
            self.hashable(v, f"{path} (an element)")
            items.append(self.encode(v, f"{path} (an element)"))
        return sorted(items, key=_json)

    def dict(self, value: dict, path: str) -> list:
        if id(value) in self.open:
            return self.cycle(value, path)
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

    def hashable(self, value, path: str) -> None:
        if _subnormal(value):
            raise TypeError(
                f"jaxbind: {self.where}: keyword argument '{path}' is, or holds, the "
                f"subnormal float {value!r}. XLA runs callables on threads that read "
                "subnormal floats as zero, where such a dict key or set element would "
                "be taken for another (0, False) when the callable's copy is made. Use it "
                "as a value rather than a key, or scale it"
            )

    def array(self, value: np.ndarray, path: str):
        dtype = _dtype_code(value.dtype, path)
        if value.dtype.itemsize == 0:
            raise NotData(f"{path}: NumPy dtype {value.dtype} has no bytes")
        order: Literal["C", "F"] = "F" if np.isfortran(value) else "C"
        value = _copy(value, always=False)
        if self.large is not None and value.nbytes > _INLINE_BYTES:
            self.large.append(value)
            flat = (value.T if order == "F" else np.ascontiguousarray(value)).reshape(-1)
            digest = hashlib.sha256(flat.view(np.uint8).data).hexdigest()
            return {"h": [dtype, list(value.shape), digest, order]}
        data = base64.b64encode(value.tobytes(order=order)).decode()
        payload = [dtype, list(value.shape), data]
        return {"a": payload + ["F"] if order == "F" else payload}

    def masked(self, value: np.ma.MaskedArray, path: str):
        if value.baseclass is not np.ndarray:
            raise NotData(f"{path}: a masked {value.baseclass.__name__} is not plain data")
        data = self.array(value.data, path)
        mask = np.ma.getmask(value)
        mask_code = None if mask is np.ma.nomask else self.array(np.asarray(mask), f"{path}.mask")
        # the fill value as set (None: NumPy's default, made when first asked for), as
        # NumPy's own pickle of a masked array keeps it
        fill = value._fill_value  # type: ignore[attr-defined]
        fill_code = None if fill is None else self.array(fill, f"{path}.fill_value")
        return {"m": [data, mask_code, fill_code, bool(value.hardmask)]}


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def _described(value) -> str:
    kind = type(value)
    for base, what in ((Enum, "an enum"), (np.ndarray, "an array subclass")):
        if isinstance(value, base):
            return f"{kind.__name__} ({what})"
    return kind.__name__


def _scalar(value: np.generic, path: str):
    array = _copy(np.asarray(value), always=False)
    if type(value) is not array.dtype.type:
        raise NotData(f"{path}: {type(value).__name__} is not plain data")
    if array.dtype.itemsize == 0:
        raise NotData(f"{path}: NumPy dtype {array.dtype} has no bytes")
    dtype = _dtype_code(array.dtype, path)
    return {"s": [dtype, [], base64.b64encode(array.tobytes()).decode()]}


def _int(encoder: _Encoder, value: int, path: str):
    return value if value in _JSON_INTS else {"I": hex(value)}


def _float_bits(value: float) -> str:
    return struct.pack("<d", value).hex()


def _bits_float(text: str) -> float:
    return struct.unpack("<d", bytes.fromhex(text))[0]


def _itself(encoder: _Encoder, value, path: str):
    return value


_ENCODE: dict[type, Callable[[_Encoder, Any, str], Any]] = {
    type(None): _itself,
    bool: _itself,
    str: _itself,
    int: _int,
    float: lambda e, v, p: {"F": _float_bits(v)},
    complex: lambda e, v, p: {"C": [_float_bits(v.real), _float_bits(v.imag)]},
    bytes: lambda e, v, p: {"b": base64.b64encode(v).decode()},
    tuple: lambda e, v, p: {"t": e.items(v, p)},
    list: lambda e, v, p: e.items(v, p),
    dict: lambda e, v, p: {"D": e.dict(v, p)},
    set: lambda e, v, p: {"S": e.unordered(v, p)},
    frozenset: lambda e, v, p: {"Z": e.unordered(v, p)},
    np.ndarray: lambda e, v, p: e.array(v, p),
}


_DOUBLE_MIN = 2.2250738585072014e-308  # the smallest normal double


def _subnormal(value) -> bool:
    """Whether `value` (a dict key, a set element) is or holds a subnormal float."""
    kind = type(value)
    if kind is float:
        return 0.0 < abs(value) < _DOUBLE_MIN
    if kind is complex:
        return _subnormal(value.real) or _subnormal(value.imag)
    if isinstance(value, np.generic):
        tiny = _smallest_normal(value.dtype)
        if tiny is None:
            return False
        parts: tuple[Any, ...] = (value.real, value.imag) if value.dtype.kind == "c" else (value,)
        return any(0 < abs(part) < tiny for part in parts)
    if kind in (tuple, frozenset) or _is_namedtuple(value):
        return any(_subnormal(item) for item in value)
    return False


@functools.cache
def _smallest_normal(dtype: np.dtype) -> Any:
    """The smallest normal magnitude of a floating dtype (None for others)."""
    if dtype.type in _ml_names():  # (some have kind "f", but NumPy's finfo knows none)
        import ml_dtypes

        try:
            return ml_dtypes.finfo(dtype).smallest_normal
        except ValueError:  # an integer type
            return None
    if dtype.kind in "fc":
        return np.finfo(dtype).smallest_normal
    return None


@functools.cache
def _ml_dtypes() -> dict[str, np.dtype]:
    """ml_dtypes' scalar types (bfloat16, float8_*, int4, ...) by name."""
    import ml_dtypes

    found = {}
    for name in dir(ml_dtypes):
        kind = getattr(ml_dtypes, name)
        if isinstance(kind, type) and issubclass(kind, np.generic):
            found[name] = np.dtype(kind)
    return found


@functools.cache
def _ml_names() -> dict[type, str]:
    """The names of ml_dtypes' scalar types (dtype.name costs microseconds)."""
    return {dtype.type: name for name, dtype in _ml_dtypes().items()}


def _dtype_code(dtype: np.dtype, path: str):
    """A dtype's JSON form (see _Encoder), or NotData."""
    if dtype.metadata is not None:
        raise NotData(f"{path}: NumPy dtype {dtype} carries metadata")
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return [_dtype_code(base, path), list(shape)]
    if dtype.names is not None:
        fields: list[tuple] = [dtype.fields[name] for name in dtype.names]  # type: ignore[index]
        titles = [field[2] if len(field) > 2 else None for field in fields]
        if any(title is not None and type(title) is not str for title in titles):
            raise NotData(f"{path}: NumPy dtype {dtype} has titles that are not strings")
        code: dict[str, Any] = {
            "names": list(dtype.names),
            "formats": [_dtype_code(field[0], path) for field in fields],
            "offsets": [field[1] for field in fields],
            "itemsize": dtype.itemsize,
        }
        if any(title is not None for title in titles):
            code["titles"] = titles
        if dtype.isalignedstruct:
            code["aligned"] = True
        return code
    ml = _ml_names().get(dtype.type)
    if ml is not None:
        return ml
    if (
        dtype.kind not in "biufcmMSUV"
        or dtype.char in "gG"  # long double: its bits mean different numbers elsewhere
        or (dtype.kind == "V" and dtype.type is not np.void)
    ):
        raise NotData(f"{path}: NumPy dtype {dtype} is not plain data")
    return dtype.str


def _dtype_from(code) -> np.dtype:
    """The dtype of a JSON form made by _dtype_code (and no other: checked)."""
    if isinstance(code, str):
        if code[:1] in ("<", ">", "|", "="):
            dtype = np.dtype(code)
        elif code in _ml_dtypes():
            dtype = _ml_dtypes()[code]
        else:
            raise ValueError(f"jaxbind: keyword arguments hold an unknown dtype {code!r}")
    elif isinstance(code, list) and len(code) == 2:
        dtype = np.dtype((_dtype_from(code[0]), tuple(code[1])))
    elif isinstance(code, dict):
        spec: Any = {
            key: code[key] for key in ("names", "offsets", "itemsize", "titles") if key in code
        }
        spec["formats"] = [_dtype_from(f) for f in code["formats"]]
        dtype = np.dtype(spec, align=bool(code.get("aligned")))
    else:
        raise ValueError(f"jaxbind: keyword arguments hold a malformed dtype {code!r}")
    try:
        _dtype_code(dtype, "")  # no object dtype, nothing but data
    except NotData:
        raise ValueError(
            f"jaxbind: keyword arguments hold an array of dtype {dtype}, which is not plain data"
        ) from None
    return dtype


def _array_from(payload) -> np.ndarray:
    dtype, shape, data, *order = payload
    raw = np.frombuffer(bytearray(base64.b64decode(data)), dtype=_dtype_from(dtype))
    return raw.reshape(shape, order="F" if order == ["F"] else "C")  # a writable view


def _scalar_from(payload) -> Any:  # a NumPy scalar
    dtype, _, data = payload
    return np.frombuffer(base64.b64decode(data), dtype=_dtype_from(dtype)).reshape(())[()]


def _masked_from(payload) -> np.ma.MaskedArray:
    data, mask, fill, hard = payload
    mask = np.ma.nomask if mask is None else _array_from(mask["a"])
    fill = None if fill is None else _array_from(fill["a"])
    return _masked(_array_from(data["a"]), mask, fill, bool(hard))


_DECODE: dict[str, Callable[[Any], Any]] = {
    "F": _bits_float,
    "C": lambda p: complex(_bits_float(p[0]), _bits_float(p[1])),
    "I": lambda p: int(p, 16),
    "b": lambda p: base64.b64decode(p),
    "t": lambda p: tuple(_from_data(v) for v in p),
    "S": lambda p: _distinct(p, {_from_data(v) for v in p}),
    "Z": lambda p: _distinct(p, frozenset(_from_data(v) for v in p)),
    "D": lambda p: _distinct(p, {_from_data(k): _from_data(v) for k, v in p}),
    "d": lambda p: {k: _from_data(v) for k, v in p},
    "s": _scalar_from,
    "a": _array_from,
    "m": _masked_from,
    "f": float,  # earlier versions
    "c": lambda p: complex(float(p[0]), float(p[1])),
}


def _distinct(payload: list, decoded):
    """`decoded`, a dict or set, if it kept every key of `payload`."""
    if len(decoded) != len(payload):
        raise ValueError(
            "jaxbind: encoded keyword arguments hold a dict or set whose keys are not "
            "distinct once decoded"
        )
    return decoded


def _from_data(obj):
    if isinstance(obj, list):
        return [_from_data(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    ((tag, payload),) = obj.items()
    decode = _DECODE.get(tag)
    if decode is None:
        raise ValueError(f"jaxbind: unknown tag {tag!r} in encoded keyword arguments")
    return decode(payload)


def _check_static(name: str, value, where: str):
    if isinstance(value, jax.core.Tracer) or isinstance(value, jax.Array):
        raise TypeError(
            f"jaxbind: {where}: keyword argument '{name}' is a JAX array or tracer; "
            "keyword arguments are static (Python values or NumPy arrays) and become part "
            "of the compiled program. Pass traced values as positional arguments."
        )
    if jax.export.is_symbolic_dim(value):
        raise TypeError(
            f"jaxbind: {where}: keyword argument '{name}' is the symbolic dimension {value} "
            "(jax.export shape polymorphism); keyword arguments are static, fixed when the "
            "program is traced, so they cannot depend on a symbolic shape. Keep that "
            "dimension concrete, or let the abstract function and the callable read it "
            "from the arrays' shapes."
        )


def encode_kwargs(kwargs: Mapping[str, Any], where: str = "jaxbind op") -> KwargsDump:
    """Encode keyword arguments into a KwargsDump (sorted by name, so order is irrelevant).

    Data (see _Encoder: numbers, strings, bytes, bools, None, NumPy scalars and arrays,
    masked arrays, tuples, lists, sets and dicts of them) is encoded as data, which
    compiled programs and exported artifacts can carry. Other picklable values stay in
    this process, named by their identity and a digest of their pickle: such calls work
    under jit but cannot be exported. Anything else is refused here, at trace time.
    """
    items = sorted(kwargs.items())
    encoder = _Encoder([], [], where)
    encoded = _json({"d": [[name, encoder.encode(value, name)] for name, value in items]})
    if not encoder.large and not encoder.local:
        return decode_kwargs(_DATA_TAG + encoded.encode())
    # Large arrays, named by their digests, or values that are not data: held in this
    # process. Large arrays are data all the same, so exports carry them in full (see
    # data_blob). Equal contents give one dump.
    blob = _LOCAL_TAG + hashlib.blake2b(encoded.encode(), digest_size=16).digest()
    dump = _local.get(blob)
    if dump is None:
        if encoder.cycles:
            memo: dict = {}
            values = {name: _copied(value, _frozen_copy, memo) for name, value in items}
        else:
            values = {name: _frozen_copy(value) for name, value in items}
        dump = _local[blob] = KwargsDump(blob, values, encoder.cycles)
    return dump


def localized(dump: KwargsDump) -> KwargsDump:
    """The same keyword arguments named by a digest of their data: for a program that
    stays in this process, which then carries 17 bytes instead of the data (a large
    array would otherwise be copied into the program, its compiled form and XLA's
    caches). The program keeps the result alive (see _rules.lowering)."""
    blob = _LOCAL_TAG + hashlib.blake2b(dump.blob, digest_size=16).digest()
    local = _local.get(blob)
    if local is None:
        local = _local[blob] = KwargsDump(blob, dump._values)
    return local


def data_blob(dump: KwargsDump) -> bytes:
    """The keyword arguments encoded as data, in full, for a program that leaves this
    process (jax.export). Call only where `not_data_reason(dump)` is None."""
    if dump.blob[:1] == _DATA_TAG:
        return dump.blob
    encoder = _Encoder(None, None)
    items = sorted(dump._values.items())
    return _DATA_TAG + _json({"d": [[k, encoder.encode(v, k)] for k, v in items]}).encode()


def is_local(dump: KwargsDump) -> bool:
    """Whether `dump` holds keyword arguments that exist only in this process."""
    return dump.blob[:1] == _LOCAL_TAG


def not_data_reason(dump: KwargsDump) -> str | None:
    """Why `dump` cannot be exported, or None if it is plain data."""
    if dump.blob[:1] == _DATA_TAG:
        return None
    encoder = _Encoder([], None)  # digests only: the check needs no encoding
    for name, value in dump._values.items():
        try:
            encoder.encode(value, name)
        except NotData as exc:
            return str(exc)
    return None


def decode_kwargs(blob: bytes) -> KwargsDump:
    """Decode a blob made by encode_kwargs (data blobs are decoded once per distinct blob).

    Only data is ever decoded: nothing in a blob can make this run code.
    """
    if blob[:1] == _LOCAL_TAG:
        dump = _local.get(blob)
        if dump is None:
            raise LookupError(
                "the keyword arguments of this call were not plain data, so they exist only "
                "in the process that traced it; the program cannot run elsewhere"
            )
        return dump
    return _decode_data(blob)


# blob -> decoded kwargs, weakly held: decoded once while anything uses them.
_decoded: weakref.WeakValueDictionary[bytes, KwargsDump] = weakref.WeakValueDictionary()


def _decode_data(blob: bytes) -> KwargsDump:
    dump = _decoded.get(blob)
    if dump is not None:
        return dump
    tag = blob[:1]
    if tag != _DATA_TAG:
        raise ValueError(f"jaxbind: unknown keyword-argument encoding {tag!r}")
    values = _from_data(json.loads(blob[1:].decode()))
    dump = KwargsDump(blob, {name: _freeze(value) for name, value in values.items()})
    _decoded[blob] = dump
    return dump


def load_kwargs(kwargs_dump) -> dict[str, Any]:
    """Return the keyword arguments of a call as a fresh dict.

    Args:
      kwargs_dump: the third argument a jaxbind callable receives. For
        compatibility with JAXbind 1.3, a pickled dict given as bytes or as a
        uint8 NumPy array is accepted too.

    Returns:
      A new dict each call, holding the keyword arguments as they were passed:
      callables may change it, and the dicts and lists in it, without any change
      reaching a later call or another binding. NumPy arrays in it are read-only,
      since every call of the same call site shares them.
    """
    if isinstance(kwargs_dump, KwargsDump):
        return kwargs_dump.to_dict()
    if isinstance(kwargs_dump, np.ndarray) and kwargs_dump.dtype == np.uint8:
        return dict(pickle.loads(kwargs_dump.tobytes()))
    if isinstance(kwargs_dump, (bytes, bytearray)):
        return dict(pickle.loads(bytes(kwargs_dump)))
    raise TypeError(
        "jaxbind.load_kwargs expects the kwargs_dump argument that a jaxbind callable "
        f"receives, got {type(kwargs_dump).__name__}"
    )
