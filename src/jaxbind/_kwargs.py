"""Keyword arguments of a call: encoded once at trace time, decoded once per call site.

Keyword arguments given to a jaxbind op at call time are static: they become
part of the compiled program. They are encoded to bytes (the bytes are what the
jit cache and the program's attributes see) and decoded back into a
`KwargsDump`, which is what callables receive as their third argument and what
`load_kwargs` turns into a fresh dict.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import weakref
from collections.abc import Mapping
from typing import Any

import jax
import jax.export  # a submodule: not loaded by "import jax"
import numpy as np

__all__ = ["KwargsDump", "data_blob", "encode_kwargs", "load_kwargs", "localized"]

# First byte of an encoded blob says how the rest is encoded:
#   J  data-only JSON (see _to_data); safe to decode from any program or artifact.
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

    __slots__ = ("blob", "_values", "__weakref__")

    def __init__(self, blob: bytes, values: Mapping[str, Any]):
        self.blob = blob
        self._values = values

    def __eq__(self, other):
        return isinstance(other, KwargsDump) and other.blob == self.blob

    def __hash__(self):
        return hash(self.blob)

    def __repr__(self):
        return "{" + ", ".join(f"{k}={_short(v)}" for k, v in self._values.items()) + "}"

    def to_dict(self) -> dict[str, Any]:
        """A fresh copy of the keyword arguments, as they were passed.

        Callers may change it: dicts and lists in it are new at every call (tuples are
        rebuilt where they hold one), so no change reaches a later call or another
        binding. NumPy arrays are shared, read-only; other objects are the objects
        that were passed (never a lookalike: see encode_kwargs).
        """
        return {name: _fresh(value) for name, value in self._values.items()}

    def names(self) -> tuple[str, ...]:
        """The names of the keyword arguments."""
        return tuple(self._values)

    def with_extra(self, **extra) -> KwargsDump:
        """This dump plus `extra` entries (e.g. batch_axes)."""
        if not extra:
            return self
        return encode_kwargs({**self._values, **extra})


def _fresh(value):
    """`value` with its dicts and lists copied, all the way down (leaves are shared)."""
    kind = type(value)
    if kind is dict:
        return {k: _fresh(v) for k, v in value.items()}
    if kind is list:
        return [_fresh(v) for v in value]
    if kind is tuple and any(type(v) in (dict, list, tuple) for v in value):
        return tuple(_fresh(v) for v in value)
    return value


def _identities(value, out: list) -> list:
    """The ids of the objects in `value` that are not plain data (see encode_kwargs)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _identities(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _identities(item, out)
    elif not (
        value is None
        or isinstance(value, (bool, int, float, complex, str, bytes, np.ndarray, np.generic))
    ):
        out.append(id(value))
    return out


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array{value.shape}:{value.dtype}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _frozen_copy(value):
    """`value` with every NumPy array in it (through tuples, lists, dicts) replaced by a
    read-only copy: every call site shares decoded kwargs, and the caller's own
    arrays are never touched. Other objects are kept as they are."""
    if isinstance(value, np.ndarray):
        value = value.copy()
        value.setflags(write=False)
        return value
    if isinstance(value, tuple):
        return tuple(_frozen_copy(item) for item in value)
    if isinstance(value, list):
        return [_frozen_copy(item) for item in value]
    if isinstance(value, dict):
        return {key: _frozen_copy(item) for key, item in value.items()}
    return value


def _freeze(value):
    """Make arrays that jaxbind itself decoded read-only (they are its own copies)."""
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _freeze(item)
    elif isinstance(value, dict):
        for item in value.values():
            _freeze(item)
    return value


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
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_static(name, item, where)
    elif isinstance(value, dict):
        for item in value.values():
            _check_static(name, item, where)


# NumPy arrays larger than this are named by a digest of their contents in the
# encoding that calls in this process use (exports carry the data itself).
_INLINE_BYTES = 4096


def _to_data(value, path, large: list | None = None):
    """A JSON-able, type-tagged form of `value` built only from data types.

    With a list `large`, an array over _INLINE_BYTES appears as its dtype, shape and
    a SHA-256 digest of its bytes, and is appended to `large`: hashing costs a
    fraction of encoding it (6 ms against 130 ms for 8 MB)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and not isinstance(value, np.integer):
        return value
    if isinstance(value, float):
        return {"f": repr(value)}  # exact, including inf and nan
    if isinstance(value, complex):
        return {"c": [repr(value.real), repr(value.imag)]}
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufc" and arr.dtype.name != "bfloat16":
            raise NotData(f"{path}: NumPy dtype {arr.dtype} is not plain data")
        dtype = arr.dtype.str if arr.dtype.kind != "V" else arr.dtype.name
        contiguous = np.ascontiguousarray(arr)
        if large is not None and arr.nbytes > _INLINE_BYTES and isinstance(value, np.ndarray):
            large.append(value)
            digest = hashlib.sha256(contiguous.reshape(-1).view(np.uint8).data).hexdigest()
            return {"h": [dtype, list(arr.shape), digest]}
        payload = [dtype, list(arr.shape), base64.b64encode(contiguous.tobytes()).decode()]
        return {"s" if isinstance(value, np.generic) else "a": payload}
    if isinstance(value, tuple):
        return {"t": [_to_data(v, f"{path}[{i}]", large) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_to_data(v, f"{path}[{i}]", large) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise NotData(f"{path}: dict keys must be strings")
        return {"d": [[k, _to_data(v, f"{path}[{k!r}]", large)] for k, v in sorted(value.items())]}
    raise NotData(f"{path}: {type(value).__name__} is not plain data")


def _dtype_of(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    dtype = np.dtype(name)
    if dtype.kind not in "biufc":
        raise ValueError(
            f"jaxbind: keyword arguments hold an array of dtype {name!r}, which is not plain data"
        )
    return dtype


def _from_data(obj):
    if isinstance(obj, list):
        return [_from_data(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    ((tag, payload),) = obj.items()
    if tag == "f":
        return float(payload)
    if tag == "c":
        return complex(float(payload[0]), float(payload[1]))
    if tag == "t":
        return tuple(_from_data(v) for v in payload)
    if tag == "d":
        return {k: _from_data(v) for k, v in payload}
    if tag in ("a", "s"):
        dtype, shape, data = payload
        arr = np.frombuffer(base64.b64decode(data), dtype=_dtype_of(dtype)).reshape(shape)
        return arr[()] if tag == "s" else arr.copy()
    raise ValueError(f"jaxbind: unknown tag {tag!r} in encoded keyword arguments")


def encode_kwargs(kwargs: Mapping[str, Any], where: str = "jaxbind op") -> KwargsDump:
    """Encode keyword arguments into a KwargsDump (sorted by name, so order is irrelevant).

    Plain data (numbers, strings, bools, None, tuples, lists, str-keyed dicts,
    NumPy arrays) is encoded as data, which compiled programs and exported
    artifacts can carry. Other picklable values stay in this process, named by
    a digest: such calls work under jit but cannot be exported.
    """
    items = sorted(kwargs.items())
    for name, value in items:
        _check_static(name, value, where)
    large: list = []
    try:
        data = {"d": [[name, _to_data(value, name, large)] for name, value in items]}
    except NotData:
        pass
    else:
        encoded = json.dumps(data, separators=(",", ":")).encode()
        if not large:
            return decode_kwargs(_DATA_TAG + encoded)
        # Large arrays: named by their digests, held in this process; data all the same,
        # so exports carry them in full (see data_blob). Equal contents give one dump.
        blob = _LOCAL_TAG + hashlib.blake2b(b"data" + encoded, digest_size=16).digest()
        dump = _local.get(blob)
        if dump is None:
            dump = KwargsDump(blob, {name: _frozen_copy(value) for name, value in items})
            _local[blob] = dump
        return dump
    try:
        pickled = pickle.dumps(items, protocol=4)
    except Exception as exc:
        raise TypeError(
            f"jaxbind: {where}: keyword arguments must be plain data or picklable; "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    # Two objects that pickle alike are still two objects (a plan, a handle, anything
    # whose state lives outside its pickle): the digest names the very objects too.
    # Their ids stay theirs while the dump, which holds them, lives.
    identities = repr(_identities([value for _, value in items], [])).encode()
    blob = _LOCAL_TAG + hashlib.blake2b(pickled + identities, digest_size=16).digest()
    dump = _local.get(blob)
    if dump is None:
        dump = KwargsDump(blob, {name: _frozen_copy(value) for name, value in items})
        _local[blob] = dump
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
    data = {"d": [[name, _to_data(value, name)] for name, value in sorted(dump._values.items())]}
    return _DATA_TAG + json.dumps(data, separators=(",", ":")).encode()


def is_local(dump: KwargsDump) -> bool:
    """Whether `dump` holds keyword arguments that exist only in this process."""
    return dump.blob[:1] == _LOCAL_TAG


def not_data_reason(dump: KwargsDump) -> str | None:
    """Why `dump` cannot be exported, or None if it is plain data."""
    if dump.blob[:1] == _DATA_TAG:
        return None
    for name, value in dump._values.items():
        try:
            _to_data(value, name, [])  # digests only: the check needs no encoding
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
