"""The copies of keyword arguments that a dump keeps and hands out.

A dump keeps a read-only copy of every NumPy array it was given (the caller's arrays
are never touched, and every call site shares the dump), and hands callables fresh
dicts, lists and sets at every call (no change reaches a later call). Keyword
arguments that hold themselves (a list or dict in itself: a cycle) are copied by
`copied`, which keeps each cycle in the copy; `fresh` and `frozen_copy` would go round
forever.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "copied",
    "copy_array",
    "freeze",
    "fresh",
    "frozen_copy",
    "is_namedtuple",
    "masked",
    "shared_values",
]


def is_namedtuple(value) -> bool:
    """A namedtuple (no instance dict): a value like a tuple, of a class of the user's."""
    return (
        isinstance(value, tuple)
        and hasattr(type(value), "_fields")
        and not hasattr(value, "__dict__")
    )


_COPIED = (dict, list, set)
_SHARED = frozenset((type(None), bool, int, float, complex, str, bytes, np.ndarray))


def fresh(value):
    """`value` with its dicts, lists and sets copied, all the way down (leaves are shared)."""
    # This runs where the callable runs: on XLA's threads, which read subnormal floats as
    # zero. Dicts and sets are copied with their stored hashes (no key is hashed again but
    # to replace a value; see codec.subnormal).
    kind = type(value)
    if kind in _SHARED:
        return value
    if kind is dict:
        new = value.copy()
        for k, v in value.items():
            if type(v) in _COPIED or isinstance(v, tuple):
                new[k] = fresh(v)
        return new
    if kind is list:
        return [fresh(v) for v in value]
    if isinstance(value, tuple):
        if (kind is tuple or is_namedtuple(value)) and any(
            type(v) in _COPIED or isinstance(v, tuple) for v in value
        ):
            return tuple.__new__(kind, [fresh(v) for v in value])
        return value
    if kind is set:
        return value.copy()  # its elements are hashable: nothing in them to copy
    return value


def _unchanging(value) -> bool:
    """Whether `fresh` would give `value` an equal value with nothing to change in it: no
    dict, list or set anywhere in it (through tuples)."""
    if type(value) in _COPIED:
        return False
    if isinstance(value, tuple):
        return all(_unchanging(v) for v in value)
    return True


def shared_values(values) -> bool:
    """Whether a dump's values may go to every call as they are, instead of `fresh`
    copies: none holds a dict, list or set that a callable could change."""
    return all(_unchanging(v) for v in values.values())


def copied(value, leaf: Callable, memo: dict):
    """`value` with its dicts, lists, sets and tuples copied and `leaf` of anything else,
    each cycle kept (`memo`: id -> copy): for keyword arguments that hold themselves, in
    which fresh and frozen_copy would go round forever."""
    if id(value) in memo:
        return memo[id(value)]
    kind = type(value)
    if kind is list:
        items: list = []
        memo[id(value)] = items
        items.extend(copied(v, leaf, memo) for v in value)
        return items
    if kind is dict:  # (its keys: hashable, no subnormal float among them: see codec)
        pairs: dict = {}
        memo[id(value)] = pairs
        pairs.update((k, copied(v, leaf, memo)) for k, v in value.items())
        return pairs
    if kind is tuple or is_namedtuple(value):  # (a cycle through it goes through a list)
        copies = [copied(v, leaf, memo) for v in value]
        return memo.setdefault(id(value), tuple.__new__(kind, copies))
    return set(value) if kind is set else leaf(value)


def frozen_copy(value):
    """`value` with every NumPy array in it (through tuples, lists, dicts) replaced by a
    read-only copy: every call site shares decoded kwargs, and the caller's own
    arrays are never touched. Other objects are kept as they are: the encoding named
    them by identity (see codec)."""
    kind = type(value)
    if kind is np.ndarray:
        return freeze(copy_array(value))
    if kind is np.ma.MaskedArray and value.baseclass is np.ndarray:
        mask = np.ma.getmask(value)
        return freeze(
            masked(
                copy_array(value.data),
                mask if mask is np.ma.nomask else copy_array(mask),
                None if value._fill_value is None else value._fill_value.copy(),
                value.hardmask,
            )
        )
    if kind is tuple or is_namedtuple(value):
        return tuple.__new__(kind, [frozen_copy(item) for item in value])
    if kind is list:
        return [frozen_copy(item) for item in value]
    if kind is dict:
        return {key: frozen_copy(item) for key, item in value.items()}
    if kind is set:
        return set(value)
    return value


def copy_array(array: np.ndarray, *, always: bool = True) -> np.ndarray:
    """A copy of `array` in its order (Fortran order stays Fortran order), the padding of
    a structured dtype zeros: NumPy's copies leave padding undefined, so it is no part
    of the value, and equal values encode alike. Without `always`, an array that has no
    padding to clear is itself."""
    if array.dtype.names is None:
        return array.copy(order="A") if always else array
    clean = np.zeros(array.shape, array.dtype, order="F" if np.isfortran(array) else "C")
    clean[...] = array
    return clean


def freeze(value):
    """Make arrays that jaxbind itself made read-only (they are its own copies)."""
    kind = type(value)
    if kind is np.ndarray:
        value.setflags(write=False)
    elif kind is np.ma.MaskedArray:
        value.setflags(write=False)
        mask = np.ma.getmask(value)
        if mask is not np.ma.nomask:
            mask.setflags(write=False)
    elif kind in (list, tuple) or is_namedtuple(value):
        for item in value:
            freeze(item)
    elif kind is dict:
        for item in value.values():
            freeze(item)
    return value


def masked(data, mask, fill_value, hard_mask) -> np.ma.MaskedArray:
    """A masked array of exactly these parts (an all-False mask stays an array)."""
    return np.ma.MaskedArray(
        data, mask=mask, fill_value=fill_value, hard_mask=hard_mask, shrink=False, copy=False
    )
