"""The bodies and the shape function of a pytree-API op, made for calls: each groups the
call's flat arrays into the user's pytrees (see trees.layout) and takes its results
back, as the trampoline (callables) or the rules (JAX functions, shapes) call it.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.tree_util import treedef_is_leaf

from .._api import check_body_runs
from .._avals import shown
from .._errors import about, refused_arguments
from .._kwargs import KwargsDump, load_kwargs
from .._kwargs.copies import shared_values
from .._roles import Args, Body
from .._spec import BatchAxes
from .._state import current_state
from .trees import layout, split, structures

__all__ = ["JaxDerivative", "Shapes", "body", "check_declared"]


def check_declared(name: str, declared, effectful: bool) -> None:
    """What the shape function returned: a pytree of jax.ShapeDtypeStruct (or of anything
    with a tuple ``shape`` and a ``dtype``, as jax.eval_shape gives and jax.pure_callback
    takes), else a TypeError saying what it returned and what it must return. No outputs
    (None, ()) only for an op with a side effect: nothing else would ever call it."""
    leaves = jax.tree.leaves(declared)
    if (leaves or effectful) and all(
        isinstance(getattr(leaf, "shape", None), tuple) and hasattr(leaf, "dtype")
        for leaf in leaves
    ):
        return
    hint = ""
    if not leaves:
        hint = " (no outputs, and the op has no side effect: nothing would ever call it)"
    elif isinstance(declared, (tuple, list)) and all(
        isinstance(d, (tuple, list)) and len(d) in (2, 3) and isinstance(d[0], (tuple, list))
        for d in declared
    ):
        hint = (
            ": ((shape, dtype), ...) is JAXbind 1.3's form; here "
            "write jax.ShapeDtypeStruct(shape, dtype) for each output"
        )
    elif isinstance(declared, (tuple, list)) and len(declared) == 2:
        hint = ": for (shape, dtype), write jax.ShapeDtypeStruct(shape, dtype)"
    raise TypeError(
        f"{about(name)}: the shape function returned {shown(declared)}{hint}. It must return a "
        "jax.ShapeDtypeStruct for one output, or a pytree (tuple, list, dict) of them for "
        "several, e.g. jax.ShapeDtypeStruct(x.shape, x.dtype)"
    )


def check_takes_state(name: str, what: str, fn, sdef=None) -> None:
    """An op given ``state=`` (`sdef`): each body takes it (a ``state`` parameter, or
    ``**kwargs``)."""
    if Body.of(fn).compiled:
        fn.check_state(f"{about(name)} ({what})", sdef)
        return
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    if not any(p.name == "state" or p.kind is p.VAR_KEYWORD for p in params):
        raise TypeError(
            f"{about(name)} ({what}) takes no 'state' argument, but the op was given state=; "
            f"add one to its parameters (def {getattr(fn, '__name__', 'f')}(..., *, state, "
            "**kwargs))"
        )


def _takes_out(fn: Callable) -> bool:
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _wrote(returned, out) -> bool:
    """Whether what a callable with out= returned is its out argument (NumPy's ufuncs,
    np.sin(x, out=out), return it), rather than results it did not write."""
    leaves = jax.tree.leaves(returned)
    return len(leaves) == len(out) and all(r is o for r, o in zip(leaves, out))


class _Body:
    """One body or shape function of a pytree-API op, made for calls by `for_trees`: the call's
    pytree structure decides how its flat arrays are grouped into the user's pytrees."""

    def __init__(self, op, fn: Callable, args: Args, what: str, index=None):
        self.op, self.fn, self.args, self.what, self.index = op, fn, args, what, index
        functools.update_wrapper(self, fn, updated=())

    def trees(self, trees: KwargsDump):
        ins, outs = structures(trees)
        return layout(self.args, ins, outs, self.op.fixed, self.index)

    def __call__(self, *args, **kwargs):
        raise TypeError(
            f"{about(self.op.name)} ({self.what}) is called with the pytree structure of "
            "a call (for_trees), not directly"
        )


class _Callable(_Body):
    """A callable of a pytree-API op, as the trampoline calls it: (out, args, kwargs_dump)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.takes_out = _takes_out(self.fn)

    def check_keywords(self, kwargs: dict) -> None:
        """A TypeError, at trace time, if the callable's parameters do not take the call's
        keyword arguments (which the shape function took)."""
        kwargs = {k: v for k, v in kwargs.items() if k != "batch_axes"}
        if self.takes_out:
            kwargs["out"] = None
        refused = refused_arguments(self.fn, None, kwargs) if kwargs else None
        if refused is not None:
            problem, fix, _ = refused
            raise TypeError(
                f"{about(self.op.name)} ({self.what}) {problem}. A call's keyword "
                f"arguments go to {self.what} as well as to the shape function: {fix}"
            )

    def for_trees(self, trees: KwargsDump) -> Callable:
        """The callable for calls with this pytree structure: `_run`, made for it once."""
        arg_trees, out_tree = self.trees(trees)
        return functools.partial(self._run, arg_trees, out_tree)

    def for_site(self, trees: KwargsDump, kwargs_dump: KwargsDump) -> Callable:
        """The callable for one call site, which hands every call the site's keyword
        arguments (`kwargs_dump`): with a short path for the common call (`_shortcut`)."""
        arg_trees, out_tree = self.trees(trees)
        general = functools.partial(self._run, arg_trees, out_tree)
        shared = _shared_kwargs(kwargs_dump)
        if shared is None or self.op.options.state is not None:
            return general
        return self._shortcut(arg_trees, out_tree, general, kwargs_dump, shared)

    def _shortcut(self, arg_trees, out_tree, general: Callable, site_dump, shared) -> Callable:
        """The site's callable at the cost of the 1.3 API's own, for a site whose keyword
        arguments every call may share (`shared`: no copies, no batch axes; see
        `_shared_kwargs`): the pytrees built by their structures alone (an argument that
        is one array is the array itself, as is one output), the checks made once here.
        A call with other keyword arguments than the site's, and results that are not
        exactly the outputs' arrays, take `general` (`_run`), which checks and copies."""
        fn, one_out = self.fn, _one_array(out_tree)
        tree = arg_trees[0] if arg_trees else jax.tree.structure(None)
        one_arg = len(arg_trees) == 1 and _one_array(tree)
        if all(_one_array(t) for t in arg_trees):
            user_args = None
        elif len(arg_trees) == 1:  # one pytree

            def user_args(args):
                return (tree.unflatten(args),)

        else:
            ends = list(itertools.accumulate(t.num_leaves for t in arg_trees))
            spans = [(t, end - t.num_leaves, end) for t, end in zip(arg_trees, ends)]

            def user_args(args):
                return [t.unflatten(args[start:end]) for t, start, end in spans]

        if self.takes_out and one_arg and one_out and not shared:

            def run(out, args, kwargs_dump):  # the most common call, at Python's quickest
                if kwargs_dump is not site_dump:
                    return general(out, args, kwargs_dump)
                returned = fn(args[0], out=out[0])
                if returned is not None:
                    self._returned(returned, out)

        elif self.takes_out and one_out and len(arg_trees) == 1:  # one pytree in, one array out

            def run(out, args, kwargs_dump):
                if kwargs_dump is not site_dump:
                    return general(out, args, kwargs_dump)
                returned = fn(tree.unflatten(args), out=out[0], **shared)
                if returned is not None:
                    self._returned(returned, out)

        elif self.takes_out:

            def run(out, args, kwargs_dump):
                if kwargs_dump is not site_dump:
                    return general(out, args, kwargs_dump)
                if user_args is not None:
                    args = user_args(args)
                returned = fn(*args, out=out[0] if one_out else out_tree.unflatten(out), **shared)
                if returned is not None:
                    self._returned(returned, out)

        elif one_arg and one_out and not shared:

            def run(out, args, kwargs_dump):
                if kwargs_dump is not site_dump:
                    return general(out, args, kwargs_dump)
                result = fn(args[0])
                o = out[0]
                if type(result) is np.ndarray and type(o) is np.ndarray:
                    if result.shape == o.shape and (result.dtype is o.dtype or _same(result, o)):
                        o[...] = result
                        return
                self._store(out_tree, out, result)  # checked, copied, or reported

        else:

            def run(out, args, kwargs_dump):
                if kwargs_dump is not site_dump:
                    return general(out, args, kwargs_dump)
                result = fn(*(args if user_args is None else user_args(args)), **shared)
                if one_out:
                    results = [result]
                else:
                    try:
                        results = out_tree.flatten_up_to(result)
                    except (TypeError, ValueError):
                        results = []
                if len(results) == len(out) and all(map(_exact, out, results)):
                    for o, r in zip(out, results):
                        o[...] = r
                else:
                    self._store(out_tree, out, result)  # checked, copied, or reported

        return run

    def _run(self, arg_trees, out_tree, out, args, kwargs_dump):
        kwargs = load_kwargs(kwargs_dump)
        batch = kwargs.pop("batch_axes", None)
        if self.op.options.state is not None:
            kwargs["state"] = current_state()
        leaves = BatchAxes(batch).to_front(args, np.moveaxis) if batch else list(args)
        user_args = split(leaves, arg_trees)
        if self.takes_out:
            returned = self.fn(*user_args, out=out_tree.unflatten(out), **kwargs)
            if returned is not None:
                self._returned(returned, out)
            return
        self._store(out_tree, out, self.fn(*user_args, **kwargs))

    def _returned(self, returned, out) -> None:
        """A callable that takes out= returned `returned` (not None): refused, unless it is
        what it wrote into (a ufunc given out= returns it)."""
        if not _wrote(returned, out):
            raise TypeError(
                f"{self.what} takes out= but returned a {type(returned).__name__} instead "
                "of None. A callable with an out= parameter writes each result into it "
                "(out[...] = result; out[k][...] or out['key'][...] for several) and "
                "returns nothing; write into out, or drop the out= parameter and return "
                "the results"
            )

    def _store(self, out_tree, out, result) -> None:
        """Copy a body's `result` into XLA's buffers `out`, checked against the outputs'
        structure, shapes and dtypes (errors say what to return)."""
        try:
            results = out_tree.flatten_up_to(result)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{self.what} returned a result whose structure is not {out_tree}, which "
                f"{self._declares()}: {str(exc).rstrip('.')}. Return the results in that structure"
            ) from None
        for k, (o, r) in enumerate(zip(out, results)):
            r = np.asarray(r)
            if r.shape != o.shape:
                raise ValueError(  # the trampoline's report names the op and the role
                    f"{self.what} returned output {k} with shape "
                    f"{r.shape}, where {self._declares()} {o.shape}: return that shape"
                    + (", or declare the one it returns" if self._declared_by_user() else "")
                    + (
                        " (a tuple or list of one array for one output? return the array)"
                        if r.shape == (1, *o.shape) and isinstance(results[k], (tuple, list))
                        else ""
                    )
                )
            if not np.can_cast(r.dtype, o.dtype, "same_kind"):
                raise TypeError(
                    f"{self.what} returned output {k} as "
                    f"{r.dtype.name}, where {self._declares()} {o.dtype.name}, and "
                    f"{r.dtype.name} does not fit in {o.dtype.name} (NumPy's 'same_kind' "
                    f"rule): return {o.dtype.name} values (np.real(...) drops an imaginary "
                    "part)"
                    + (
                        f", or declare {r.dtype.name}, e.g. "
                        f"jax.ShapeDtypeStruct(x.shape, np.{r.dtype.name})"
                        if self._declared_by_user()
                        else ""
                    )
                )
            np.copyto(o, r, casting="same_kind")

    def _declared_by_user(self) -> bool:
        """Whether the shape function declares this role's outputs (else the primals do:
        a cotangent is shaped as its argument)."""
        return self.args in (Args.F, Args.JVP)

    def _declares(self) -> str:
        if self._declared_by_user():
            return "the shape function declares"
        return "the primal arguments (whose cotangents it returns) give"


def _one_array(tree) -> bool:
    """Whether a pytree structure is one array (not None, which is a leaf of no arrays)."""
    return tree.num_leaves == 1 and treedef_is_leaf(tree)


def _same(r, o) -> bool:
    return r.dtype == o.dtype


def _exact(o, r) -> bool:
    """Whether a result is a NumPy array of exactly its output's shape and dtype, and the
    output a NumPy array (a GPU call's CudaArray takes `_Callable._store`'s path)."""
    if type(r) is not np.ndarray or type(o) is not np.ndarray or r.shape != o.shape:
        return False
    return r.dtype is o.dtype or _same(r, o)


def _shared_kwargs(kwargs_dump) -> Mapping[str, Any] | None:
    """The keyword arguments of a dump, if every call may get the same objects (no dicts,
    lists or sets in them, which each call gets fresh: see KwargsDump.to_dict), and there
    are no batch axes among them; else None."""
    if type(kwargs_dump) is not KwargsDump or kwargs_dump._cycles:
        return None
    values = kwargs_dump._values
    if "batch_axes" in values or not shared_values(values):
        return None
    return values


def body(op, fn, args: Args, what: str, index=None):
    """A callable wrapped for pytrees; a compiled kernel as it is (it takes flat arrays)."""
    name: str = (
        getattr(op, "name", None)
        or op._explicit_name
        or getattr(op.fn, "__qualname__", None)
        or str(getattr(op.fn, "name", op.fn))  # a Kernel: its function's name
    )
    if op.options.state is not None:
        check_takes_state(name, what, fn, op.options.state)
    if Body.of(fn).compiled:
        return fn
    check_body_runs(what, fn, name, op.options)
    return _Callable(op, fn, args, what, index=index)


class JaxDerivative(_Body):
    """A derivative given as a JAX function, for a pytree-API op (pytrees in and out)."""

    def for_trees(self, trees: KwargsDump) -> Callable:
        arg_trees, out_tree = self.trees(trees)

        def call(*leaves, **kwargs):
            return out_tree.flatten_up_to(self.fn(*split(list(leaves), arg_trees), **kwargs))

        return call


class Shapes(_Body):
    """The op's shape function as its abstract function (f's, and the JVP's at the primals)."""

    def for_trees(self, trees: KwargsDump) -> Callable:
        ins, outs = structures(trees)
        return functools.partial(self._declare, ins, outs)

    def _declare(self, ins, outs, *avals, batch_axes=None, **kwargs):
        levels = ()
        if batch_axes:  # vectorized: the shape function sees the arrays without batch axes
            layout = BatchAxes(batch_axes)
            levels = layout.sizes([a.shape for a in avals])
            avals = tuple(
                jax.ShapeDtypeStruct(layout.core_shape(a.shape, i), a.dtype)
                for i, a in enumerate(avals)
            )
        declared = outs.flatten_up_to(self.fn(*split(list(avals), ins.children()), **kwargs))
        if not batch_axes:
            return tuple((d.shape, d.dtype) for d in declared)
        return tuple((levels + tuple(d.shape), d.dtype, 0) for d in declared)
