"""The pytree structure of a pytree-API op's call: encoded as a field of the call
(CallSpec.trees; the ``trees`` attribute of call format 3), decoded per role into the
pytrees of its arguments and results (`layout`, by the role's argument layout, Args).
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from .._kwargs import KwargsDump, encode_kwargs
from .._roles import Args

__all__ = ["call_trees", "layout", "skeleton", "split", "structures"]


def skeleton(tree) -> Any:
    return jax.tree.unflatten(tree, [0] * tree.num_leaves)


@functools.lru_cache(maxsize=4096)
def _structure_of(key) -> Any:
    return jax.tree.structure(key[1])


class _Tree:
    """A pytree structure that plain data cannot describe (namedtuples, OrderedDicts,
    dataclasses, custom nodes): carried in the call's pytree structure as this object,
    one per structure, so that equal structures give equal calls. Such calls stay in
    this process (jax.export refuses what is not data)."""

    __slots__ = ("treedef", "number")
    treedef: Any
    number: int
    _by_treedef: dict = {}
    _by_number: dict = {}

    def __reduce__(self):  # pickled only for the digest
        return _tree_numbered, (self.number,)

    def __repr__(self):
        return f"<pytree {self.treedef}>"

    @classmethod
    def of(cls, treedef) -> _Tree:
        token = cls._by_treedef.get(treedef)
        if token is None:
            token = cls.__new__(cls)
            token.treedef, token.number = treedef, len(cls._by_number) + 1
            cls._by_treedef[treedef] = cls._by_number[token.number] = token
        return token


def _tree_numbered(number: int) -> _Tree:  # pragma: no cover - see _Tree.__reduce__
    return _Tree._by_number[number]


def _plain(skeleton) -> bool:
    """Whether a skeleton is made only of what the data encoding keeps as it is."""
    kind = type(skeleton)
    if kind in (tuple, list):
        return all(_plain(item) for item in skeleton)
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in skeleton.items())
    return skeleton is None or kind is int


def _token(tree) -> Any:
    """What the call's pytree structure carries for the structure `tree`."""
    plain = skeleton(tree)
    return plain if _plain(plain) else _Tree.of(tree)


def _structure(skeleton) -> Any:
    if isinstance(skeleton, _Tree):
        return skeleton.treedef
    try:
        return _structure_of((repr(skeleton), skeleton))
    except TypeError:  # an unhashable skeleton (lists, dicts): no cache
        return jax.tree.structure(skeleton)


@functools.lru_cache(maxsize=4096)
def call_trees(in_tree, out_tree) -> KwargsDump:
    """A call's pytree structure (CallSpec.trees): its arguments' and its results'."""
    return encode_kwargs({"in": _token(in_tree), "out": _token(out_tree)}, where="pytree")


def structures(trees: KwargsDump) -> tuple:
    """(argument tree, result tree) of a call from its CallSpec.trees."""
    values = trees._values
    return _structure(values["in"]), _structure(values["out"])


def split(leaves, trees):
    """Unflatten consecutive runs of `leaves` into the pytrees `trees`."""
    out, pos = [], 0
    for tree in trees:
        out.append(jax.tree.unflatten(tree, leaves[pos : pos + tree.num_leaves]))
        pos += tree.num_leaves
    return out


# --- argument layouts: the pytrees each role takes, from the call's structure -------------


def _tangents(args, fixed: int):
    lin = args[fixed:]
    return jax.tree.structure(tuple(skeleton(t) for t in lin))


def layout(args_of: Args, ins, outs, fixed: int, index: int | None):
    """(argument trees, result tree) of a role (see _roles.Args), for a call of f with
    argument tree `ins` and result tree `outs`."""
    args = ins.children()
    if args_of is Args.F:
        return args, outs
    if args_of is Args.T:
        lin = args[fixed:]
        return args[:fixed] + [outs], (lin[0] if len(lin) == 1 else _tangents(args, fixed))
    if args_of is Args.T_I:
        assert index is not None
        return args[:index] + args[index + 1 :] + [outs], args[index]
    if args_of is Args.JVP:
        return [ins, _tangents(args, fixed)], outs
    return [ins, outs], _tangents(args, fixed)  # Args.VJP
