"""Keyword arguments of a call: encoded once at trace time, decoded once per call site.

Keyword arguments given to a jaxbind op at call time are static: they become
part of the compiled program. They are encoded to bytes (the bytes are what the
jit cache and the program's attributes see) and decoded back into a
`KwargsDump`, which is what callables receive as their third argument and what
`load_kwargs` turns into a fresh dict.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

__all__ = ["KwargsDump", "encode_kwargs", "load_kwargs"]

# First byte of an encoded blob: how the rest is encoded.
_PICKLE_TAG = b"P"


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
        """A fresh dict of the keyword arguments (callers may pop from it)."""
        return dict(self._values)

    def with_extra(self, **extra) -> KwargsDump:
        """This dump plus `extra` entries (e.g. batch_axes)."""
        if not extra:
            return self
        return encode_kwargs({**self._values, **extra})


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array{value.shape}:{value.dtype}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _freeze(value):
    """Make arrays inside decoded kwargs read-only: every call site shares them."""
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
            "of the compiled program. Pass traced values as positional arguments.")
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_static(name, item, where)
    elif isinstance(value, dict):
        for item in value.values():
            _check_static(name, item, where)


def encode_kwargs(kwargs: Mapping[str, Any], where: str = "jaxbind op") -> KwargsDump:
    """Encode keyword arguments into a KwargsDump (sorted by name, so order is irrelevant)."""
    items = sorted(kwargs.items())
    for name, value in items:
        _check_static(name, value, where)
    try:
        blob = _PICKLE_TAG + pickle.dumps(items, protocol=4)
    except Exception as exc:
        raise TypeError(
            f"jaxbind: {where}: keyword arguments must be picklable; "
            f"{type(exc).__name__}: {exc}") from exc
    return decode_kwargs(blob)


@functools.lru_cache(maxsize=4096)
def decode_kwargs(blob: bytes) -> KwargsDump:
    """Decode a blob made by encode_kwargs (cached: once per distinct blob)."""
    if blob[:1] != _PICKLE_TAG:
        raise ValueError(f"jaxbind: unknown keyword-argument encoding {blob[:1]!r}")
    items = pickle.loads(blob[1:])
    return KwargsDump(blob, {name: _freeze(value) for name, value in items})


def load_kwargs(kwargs_dump) -> dict[str, Any]:
    """Return the keyword arguments of a call as a fresh dict.

    Args:
      kwargs_dump: the third argument a jaxbind callable receives. For
        compatibility with JAXbind 1.3, a pickled dict given as bytes or as a
        uint8 NumPy array is accepted too.

    Returns:
      A new dict each call; callables may pop from it. NumPy arrays in it are
      read-only, since every call of the same call site shares them.
    """
    if isinstance(kwargs_dump, KwargsDump):
        return kwargs_dump.to_dict()
    if isinstance(kwargs_dump, np.ndarray) and kwargs_dump.dtype == np.uint8:
        return dict(pickle.loads(kwargs_dump.tobytes()))
    if isinstance(kwargs_dump, (bytes, bytearray)):
        return dict(pickle.loads(bytes(kwargs_dump)))
    raise TypeError(
        "jaxbind.load_kwargs expects the kwargs_dump argument that a jaxbind callable "
        f"receives, got {type(kwargs_dump).__name__}")
