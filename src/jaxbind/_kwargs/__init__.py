"""Keyword arguments of a call: encoded once at trace time, decoded once per call site.

Keyword arguments given to a jaxbind op at call time are static: they become
part of the compiled program. They are encoded to bytes (the bytes are what the
jit cache and the program's attributes see) and decoded back into a
`KwargsDump`, which is what callables receive as their third argument and what
`load_kwargs` turns into a fresh dict.

A callable receives exactly what was passed: the same types (a NumPy float64 stays
one, an IntEnum is not an int), dtypes, shapes, bits and masks. Data (see codec) is
encoded as data, which exported programs carry; any other value is held in this
process, named by its identity and a digest of its pickle: plain jit runs it,
jax.export refuses it. A value that is neither data nor picklable is refused. A list or
dict that holds itself (a cycle) is held in this process too, its cycle kept in every copy.

This module is the dump and its two blobs; the rooms beside it: codec (the JSON form,
one row per kind of value), dtypes (a dtype's JSON form), held (values that are not
data: checked static, named by their pickle), copies (what a dump keeps and hands out,
cycles kept), pickled (JAXbind 1.3's dumps, read by load_kwargs).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import pickled
from .codec import KWARGS, Encoder, NotData, dumps, loads
from .copies import copied, freeze, fresh, frozen_copy

__all__ = [
    "KwargsDump",
    "NotData",
    "data_blob",
    "decode_kwargs",
    "encode_kwargs",
    "is_local",
    "load_kwargs",
    "localized",
    "not_data_reason",
]

# First byte of an encoded blob says how the rest is encoded:
#   J  data-only JSON (see codec); safe to decode from any program or artifact.
#   H  a digest naming keyword arguments held in this process only (they could
#      not be encoded as data); never decoded from bytes, so never exportable.
_DATA_TAG = b"J"
_LOCAL_TAG = b"H"
# digest blob -> kwargs that are not data. Weakly held: an entry lives as long
# as something uses it (a CallSpec in a jaxpr or cache, a compiled program,
# which keeps it through the lowering's keepalives, or a call site).
_local: weakref.WeakValueDictionary[bytes, KwargsDump] = weakref.WeakValueDictionary()
# data blob -> decoded kwargs, weakly held: decoded once while anything uses them.
_decoded: weakref.WeakValueDictionary[bytes, KwargsDump] = weakref.WeakValueDictionary()


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
        self._cycles = cycles  # a value holds itself: copied by copies.copied

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
            return {k: copied(v, lambda leaf: leaf, memo) for k, v in self._values.items()}
        return {name: fresh(value) for name, value in self._values.items()}

    def names(self) -> tuple[str, ...]:
        """The names of the keyword arguments."""
        return tuple(self._values)

    def with_extra(self, **extra) -> KwargsDump:
        """This dump plus `extra` entries (e.g. batch_axes)."""
        if not extra:
            return self
        return encode_kwargs({**self._values, **extra})


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"{type(value).__name__}{value.shape}:{value.dtype}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def encode_kwargs(kwargs: Mapping[str, Any], where: str = "jaxbind op") -> KwargsDump:
    """Encode keyword arguments into a KwargsDump (sorted by name, so order is irrelevant).

    Data (see codec: numbers, strings, bytes, bools, None, NumPy scalars and arrays,
    masked arrays, tuples, lists, sets and dicts of them) is encoded as data, which
    compiled programs and exported artifacts can carry. Other picklable values stay in
    this process, named by their identity and a digest of their pickle: such calls work
    under jit but cannot be exported. Anything else is refused here, at trace time.
    """
    items = sorted(kwargs.items())
    encoder = Encoder([], [], where)
    encoded = dumps(encoder.write(KWARGS, items, ""))
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
            values = {name: copied(value, frozen_copy, memo) for name, value in items}
        else:
            values = {name: frozen_copy(value) for name, value in items}
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
    items = sorted(dump._values.items())
    return _DATA_TAG + dumps(Encoder(None, None).write(KWARGS, items, "")).encode()


def is_local(dump: KwargsDump) -> bool:
    """Whether `dump` holds keyword arguments that exist only in this process."""
    return dump.blob[:1] == _LOCAL_TAG


def not_data_reason(dump: KwargsDump) -> str | None:
    """Why `dump` cannot be exported, or None if it is plain data."""
    if dump.blob[:1] == _DATA_TAG:
        return None
    encoder = Encoder([], None)  # digests only: the check needs no encoding
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
    dump = _decoded.get(blob)
    if dump is not None:
        return dump
    tag = blob[:1]
    if tag != _DATA_TAG:
        raise ValueError(f"jaxbind: unknown keyword-argument encoding {tag!r}")
    values = loads(blob[1:].decode())
    dump = KwargsDump(blob, {name: freeze(value) for name, value in values.items()})
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
    old = pickled.load(kwargs_dump)
    if old is not None:
        return old
    raise TypeError(
        "jaxbind.load_kwargs expects the kwargs_dump argument that a jaxbind callable "
        f"receives, got {type(kwargs_dump).__name__}"
    )
