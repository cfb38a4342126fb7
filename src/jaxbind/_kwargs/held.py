"""Keyword arguments that are not data: held in this process, named by their pickle.

A value that no kind of the codec writes is held by the dump itself and named in the
encoding by its identity and a digest of its pickle: the id keeps two objects that
pickle alike (a plan, a handle whose state lives outside its pickle) apart, and the
digest tells a changed object from the one traced. Such a value must still be static
(no JAX array, tracer or symbolic dimension) and picklable; this module refuses the
rest, naming the op and the argument.
"""

from __future__ import annotations

import hashlib
import pickle
from enum import Enum

import jax
import jax.export  # a submodule: not loaded by "import jax"
import numpy as np

__all__ = ["described", "pickle_digest"]


def pickle_digest(value, path: str, where: str) -> str:
    """The digest of `value`'s pickle, or a TypeError for a value that is not static or
    not picklable (`path` names the argument, `where` the op)."""
    _check_static(path, value, where)
    try:
        pickled = pickle.dumps(value, protocol=4)
    except Exception as exc:
        raise TypeError(
            f"jaxbind: {where}: keyword arguments must be plain data or picklable, "
            f"and '{path}' ({type(value).__name__}) is neither: "
            f"{type(exc).__name__}: {exc}. Pass data (numbers, strings, NumPy arrays, "
            "tuples, lists, dicts of them), make the value picklable, or hand it to "
            "the callable another way (functools.partial, a closure)"
        ) from None
    return hashlib.blake2b(pickled, digest_size=16).hexdigest()


def described(value) -> str:
    """What `value` is, for a message saying it is not data."""
    kind = type(value)
    for base, what in ((Enum, "an enum"), (np.ndarray, "an array subclass")):
        if isinstance(value, base):
            return f"{kind.__name__} ({what})"
    return kind.__name__


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
