"""The JAX-native API: ops defined as ``jax.custom_vjp`` and ``torch.library.custom_op`` are.

::

    @jaxbind.linear_op(shape=lambda x, *, axes=None: jax.ShapeDtypeStruct(x.shape, x.dtype))
    def fft(x, *, axes=None):                    # NumPy in, NumPy back (or write into out=)
        return scipy.fft.fftn(x, axes=axes)

    @fft.def_transpose
    def fft_T(ct, *, axes=None):
        return scipy.fft.fftn(ct, axes=axes)

    y = fft(x, axes=(0,))                        # one output: an array

Ops made this way are bindings of the same machinery as ``get_linear_call`` and
``get_nonlinear_call`` (one `jaxbind` primitive, names, export, batching,
sharding, GPU, ``jaxbind.testing.check``). This module only translates:

- arguments and results are pytrees of arrays; the structures travel to the
  callables as two reserved keyword arguments (``jaxbind_in``, ``jaxbind_out``:
  the pytrees with 0 for every array), so programs stay exportable when the
  structures are made of tuples, lists, dicts and None;
- shapes are ``jax.ShapeDtypeStruct`` pytrees returned by ``shape``; those of
  transposes and VJPs come from the primals (see CallSpec.out_hint);
- a callable either returns its results, which jaxbind copies into XLA's
  buffers, or, if it takes an ``out=`` keyword argument, writes into them;
- ``vectorized=True``: the callables get every batched array with its batch axes
  in front (outermost vmap first) and return results laid out the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._api import Op, make_op
from ._binding import JaxFunction, Kind, is_jax_function, jax_function
from ._errors import about, add_context
from ._kwargs import load_kwargs
from ._options import Options, declare

__all__ = ["NativeOp", "linear_op", "multilinear_op", "nonlinear_op"]

IN, OUT = "jaxbind_in", "jaxbind_out"  # reserved keyword arguments: pytree skeletons

ShapeFn = Callable[..., Any]


def _skeleton(tree) -> Any:
    return jax.tree.unflatten(tree, [0] * tree.num_leaves)


@functools.lru_cache(maxsize=4096)
def _structure_of(key) -> Any:
    return jax.tree.structure(key[1])


class _Tree:
    """A pytree structure that plain data cannot describe (namedtuples, OrderedDicts,
    dataclasses, custom nodes): carried in the call's keyword arguments as this object,
    one per structure, so that equal structures give equal calls. Such calls stay in
    this process (jax.export refuses keyword arguments that are not data)."""

    __slots__ = ("treedef", "number")
    _by_treedef: dict = {}
    _by_number: dict = {}

    def __reduce__(self):  # pickled only for the keyword arguments' digest
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
    """What the call's keyword arguments carry for the pytree structure `tree`."""
    skeleton = _skeleton(tree)
    return skeleton if _plain(skeleton) else _Tree.of(tree)


def _structure(skeleton) -> Any:
    if isinstance(skeleton, _Tree):
        return skeleton.treedef
    try:
        return _structure_of((repr(skeleton), skeleton))
    except TypeError:  # an unhashable skeleton (lists, dicts): no cache
        return jax.tree.structure(skeleton)


def _takes_out(fn: Callable) -> bool:
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _front(a, axes):
    """An array with its batch axes (innermost first) moved to the front, outermost first."""
    return np.moveaxis(a, list(reversed(axes)), list(range(len(axes)))) if axes else a


def _split(leaves, trees):
    """Unflatten consecutive runs of `leaves` into the pytrees `trees`."""
    out, pos = [], 0
    for tree in trees:
        out.append(jax.tree.unflatten(tree, leaves[pos : pos + tree.num_leaves]))
        pos += tree.num_leaves
    return out


class _Callable:
    """One callable of a native op, in JAXbind's (out, args, kwargs_dump) protocol."""

    def __init__(self, native: NativeOp, fn: Callable, layout: Callable, what: str):
        self.native, self.fn, self.layout, self.what = native, fn, layout, what
        self.takes_out = _takes_out(fn)
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, out, args, kwargs_dump):
        kwargs = load_kwargs(kwargs_dump)
        ins, outs = _structure(kwargs.pop(IN)), _structure(kwargs.pop(OUT))
        batch = kwargs.pop("batch_axes", None)
        leaves = [_front(a, ax) for a, ax in zip(args, batch)] if batch else list(args)
        arg_trees, out_tree = self.layout(ins, outs)
        user_args = _split(leaves, arg_trees)
        if self.takes_out:
            self.fn(*user_args, out=jax.tree.unflatten(out_tree, list(out)), **kwargs)
            return
        result = self.fn(*user_args, **kwargs)
        try:
            results = out_tree.flatten_up_to(result)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{about(self.native.name)} ({self.what}) returned a result whose "
                f"structure is not {out_tree}: {exc}"
            ) from None
        for k, (o, r) in enumerate(zip(out, results)):
            r = np.asarray(r)
            if r.shape != o.shape:
                raise ValueError(
                    f"{about(self.native.name)} ({self.what}) returned output {k} "
                    f"with shape {r.shape}; its shape says {o.shape}"
                )
            np.copyto(o, r, casting="same_kind")


class _JaxDerivative:
    """A derivative given as a JAX function, for a native op (pytrees in and out)."""

    def __init__(self, native: NativeOp, fn: Callable, layout: Callable):
        self.native, self.fn, self.layout = native, fn, layout

    def __call__(self, *leaves, **kwargs):
        ins, outs = _structure(kwargs.pop(IN)), _structure(kwargs.pop(OUT))
        arg_trees, out_tree = self.layout(ins, outs)
        return out_tree.flatten_up_to(self.fn(*_split(list(leaves), arg_trees), **kwargs))


class NativeOp:
    """An op of the JAX-native API (made by :func:`linear_op`, :func:`multilinear_op` or
    :func:`nonlinear_op`). Call it with pytrees of arrays and static keyword arguments;
    it returns the pytree its ``shape`` function describes (one array for one output).

    Attributes:
      name: the binding's name, as jaxprs, HLO and exported programs show it.
      op: the underlying :class:`jaxbind.Op` (built at the first call).
    """

    def __init__(
        self,
        kind: str,
        fn: Callable,
        shape: ShapeFn,
        *,
        name: str | None,
        replace: bool,
        options: Options,
    ):
        if not callable(fn) or not callable(shape):
            raise TypeError("jaxbind: the function and its shape must be callables")
        self.kind, self.fn, self.shape, self.options = kind, fn, shape, options
        self.fixed, self.vectorized = options.fixed, options.vectorized
        self._explicit_name, self._replace = name, replace
        self._transposes: dict[int | None, Callable] = {}
        self._jvp: Callable | None = None
        self._vjp: Callable | None = None
        self._called = False
        functools.update_wrapper(self, fn, updated=())
        # Registered now, so that a process that only imports the op can run exported
        # programs that call it; def_* fill in the derivatives before the first call.
        self._op: Op = self._make()
        self.name = self._op.name  # the default, or "#2"... after a clash of default names

    def __repr__(self):
        return f"<jaxbind native {self.kind} op '{self.name}'>"

    # --- derivatives -------------------------------------------------------------------
    def _define(self, what: str):
        if self._called:
            raise RuntimeError(
                f"{about(self.name)} was already called; define its {what} before the first call"
            )

    def def_transpose(self, fn: Callable | None = None, *, argnum: int | None = None):
        """Define the transpose (decorator). Linear ops: ``fn(*fixed, ct, **kwargs)``
        returns the cotangent of the linear argument (a tuple of them if there are
        several). Multilinear ops, once per argument: ``argnum=i``, and
        ``fn(*other_args, ct, **kwargs)`` returns the cotangent of argument i."""
        if fn is None:
            return functools.partial(self.def_transpose, argnum=argnum)
        self._define("transpose")
        if self.kind == "nonlinear":
            raise TypeError(f"{about(self.name)} is nonlinear: use def_jvp and def_vjp")
        if (self.kind == "multilinear") != (argnum is not None):
            raise TypeError(
                f"{about(self.name)}: def_transpose takes argnum= for "
                "multilinear ops, and only for them"
            )
        self._transposes[argnum] = fn
        self._refresh()
        return fn

    def def_jvp(self, fn: Callable) -> Callable:
        """Define the JVP of a nonlinear op (decorator): ``fn(primals, tangents, **kwargs)``
        with the tuple of all arguments and the tuple of the tangents of the non-fixed
        ones; returns the output tangents. Wrap it in ``jaxbind.jax_function`` to make
        it a JAX function (then it is differentiable again: Hessians)."""
        self._check_nonlinear("def_jvp")
        self._define("JVP")
        self._jvp = fn
        self._refresh()
        return fn

    def def_vjp(self, fn: Callable) -> Callable:
        """Define the VJP of a nonlinear op (decorator): ``fn(primals, cotangents, **kwargs)``
        returns a tuple with the cotangent of each non-fixed argument."""
        self._check_nonlinear("def_vjp")
        self._define("VJP")
        self._vjp = fn
        self._refresh()
        return fn

    def _check_nonlinear(self, what):
        if self.kind != "nonlinear":
            raise TypeError(f"{about(self.name)} is {self.kind}: use def_transpose, not {what}")

    # --- the binding -------------------------------------------------------------------
    def _layout_f(self, ins, outs):
        return ins.children(), outs

    def _layout_T(self, ins, outs):
        args = ins.children()
        lin = args[self.fixed :]
        out = lin[0] if len(lin) == 1 else jax.tree.structure(tuple(_skeleton(t) for t in lin))
        return args[: self.fixed] + [outs], out

    def _layout_Ti(self, i):
        def layout(ins, outs):
            args = ins.children()
            return args[:i] + args[i + 1 :] + [outs], args[i]

        return layout

    def _primals_tangents(self, ins):
        args = ins.children()
        return ins, jax.tree.structure(tuple(_skeleton(t) for t in args[self.fixed :]))

    def _layout_jvp(self, ins, outs):
        primals, tangents = self._primals_tangents(ins)
        return [primals, tangents], outs

    def _layout_vjp(self, ins, outs):
        primals, tangents = self._primals_tangents(ins)
        return [primals, outs], tangents

    def _abstract(self, *avals, batch_axes=None, **kwargs):
        ins, outs = _structure(kwargs.pop(IN)), _structure(kwargs.pop(OUT))
        levels = ()
        if batch_axes:  # vectorized: the shape function sees the arrays without batch axes
            levels = next(
                tuple(a.shape[k] for k in reversed(ax)) for a, ax in zip(avals, batch_axes) if ax
            )
            avals = [
                jax.ShapeDtypeStruct(
                    tuple(d for k, d in enumerate(a.shape) if k not in ax), a.dtype
                )
                for a, ax in zip(avals, batch_axes)
            ]
        declared = outs.flatten_up_to(self.shape(*_split(list(avals), ins.children()), **kwargs))
        if not batch_axes:
            return tuple((d.shape, d.dtype) for d in declared)
        return tuple((levels + tuple(d.shape), d.dtype, 0) for d in declared)

    def _transposes_now(self):
        if self.kind == "linear":
            t = self._transposes.get(None)
            return _Callable(self, t, self._layout_T, "the transpose") if t is not None else None
        n = max(self._transposes, default=-1) + 1
        return tuple(
            _Callable(
                self,
                self._transposes[i],
                self._layout_Ti(i),
                f"the transpose with respect to argument {i}",
            )
            if i in self._transposes
            else None
            for i in range(n)
        )

    def _derivatives_now(self):
        derivatives = []
        for fn, layout, what in (
            (self._jvp, self._layout_jvp, "the JVP"),
            (self._vjp, self._layout_vjp, "the VJP"),
        ):
            if fn is None:
                derivatives.append(None)
            elif is_jax_function(fn):
                inner = fn.fn if isinstance(fn, JaxFunction) else fn
                derivatives.append(jax_function(_JaxDerivative(self, inner, layout)))
            else:
                derivatives.append(_Callable(self, fn, layout, what))
        return tuple(derivatives)

    def _make(self) -> Op:
        """The binding, registered now with the function alone; def_* add the rest."""
        f = _Callable(self, self.fn, self._layout_f, "the function")
        kind = Kind(self.kind)
        transposes = {Kind.LINEAR: None, Kind.MULTILINEAR: ()}.get(kind)
        derivatives = (None, None) if kind is Kind.NONLINEAR else None
        abstract_T = () if kind is Kind.MULTILINEAR else None
        return make_op(
            kind,
            f,
            transposes,
            derivatives,
            self._abstract,
            abstract_T,
            self.options,
            self._explicit_name,
            self._replace,
        )

    def _refresh(self):
        """Give the registered binding the derivatives defined so far (before any call)."""
        binding = self._op.binding
        if self.kind == "nonlinear":
            binding.derivatives = self._derivatives_now()
        else:
            binding.transposes = self._transposes_now()
            if self.kind == "multilinear":
                binding.abstract_T = (None,) * len(binding.transposes)

    @property
    def op(self) -> Op:
        return self._op

    @property
    def binding(self):
        return self._op.binding

    def protocol_call(self, *args, **kwargs) -> tuple[list, dict]:
        """The array arguments and keyword arguments of the underlying JAXbind-protocol op
        for this call (used by jaxbind.testing.check)."""
        for key in (IN, OUT):
            if key in kwargs:
                raise TypeError(f"{about(self.name)}: the keyword argument '{key}' is reserved")
        for i in range(min(self.fixed, len(args))):
            if jax.tree.structure(args[i]).num_leaves != 1 or not jax.tree_util.treedef_is_leaf(
                jax.tree.structure(args[i])
            ):
                raise TypeError(
                    f"{about(self.name)}: fixed argument {i} must be one array, not a pytree"
                )
        leaves, in_tree = jax.tree.flatten(args)
        leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in leaves]
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
        try:
            declared = self.shape(*jax.tree.unflatten(in_tree, specs), **kwargs)
        except Exception as exc:
            raise add_context(exc, f"jaxbind: the shape function of '{self.name}' failed") from None
        out_tree = jax.tree.structure(declared)
        return leaves, {**kwargs, IN: _token(in_tree), OUT: _token(out_tree)}

    def __call__(self, *args, **kwargs):
        op = self._op
        self._called = True
        leaves, call_kwargs = self.protocol_call(*args, **kwargs)
        results = op(*leaves, **call_kwargs)
        return jax.tree.unflatten(_structure(call_kwargs[OUT]), results)


def _decorator(what: str, kind: str, shape: ShapeFn, name, replace, fixed, vectorized, options):
    checked = declare(what, kind, fixed, vectorized, options, native=True)

    def make(fn: Callable) -> NativeOp:
        return NativeOp(kind, fn, shape, name=name, replace=replace, options=checked)

    return make


def linear_op(
    *,
    shape: ShapeFn,
    name: str | None = None,
    replace: bool = False,
    fixed: int = 0,
    vectorized: bool = False,
    **options,
) -> Callable[[Callable], NativeOp]:
    """Decorator: a linear op (linear in every argument after the first `fixed`).

    Args:
      shape: ``shape(*args, **kwargs)`` with ``jax.ShapeDtypeStruct``-like arguments,
        returning the output's ``jax.ShapeDtypeStruct`` (or a pytree of them).
      name: the binding's name (default: module and qualified name of the function).
      replace: as for :func:`jaxbind.get_linear_call`: take over a name that another
        binding has. Not needed to run a notebook cell or a module again: a function
        defined again at the same place replaces its earlier binding.
      fixed: leading arguments that are parameters (single arrays), not linear inputs.
      vectorized: the callables handle batches themselves: batched arrays arrive
        with their batch axes in front, and results go back the same way.
      **options: ``platform_mode``, ``input_output_aliases`` (indices of array
        leaves), ``has_side_effect``, ``ordered``: the options of both APIs (see
        :func:`jaxbind.get_linear_call`).

    The decorated function gets NumPy arrays (pytrees as given) and the keyword
    arguments, and returns its result, or writes into ``out=`` if it takes that
    argument. Define the transpose with ``@op.def_transpose``.
    """
    return _decorator("linear_op", "linear", shape, name, replace, fixed, vectorized, options)


def multilinear_op(
    *,
    shape: ShapeFn,
    name: str | None = None,
    replace: bool = False,
    fixed: int = 0,
    vectorized: bool = False,
    **options,
) -> Callable[[Callable], NativeOp]:
    """Decorator: an op linear in each argument separately (e.g. a product).

    As :func:`linear_op`; define one transpose per argument with
    ``@op.def_transpose(argnum=i)``.
    """
    return _decorator(
        "multilinear_op", "multilinear", shape, name, replace, fixed, vectorized, options
    )


def nonlinear_op(
    *,
    shape: ShapeFn,
    name: str | None = None,
    replace: bool = False,
    fixed: int = 0,
    vectorized: bool = False,
    **options,
) -> Callable[[Callable], NativeOp]:
    """Decorator: a nonlinear op. As :func:`linear_op`; define its derivatives with
    ``@op.def_jvp`` and ``@op.def_vjp`` (callables, or ``jaxbind.jax_function``\\ s for
    second derivatives). Its options include ``linear_in``, as for
    :func:`jaxbind.get_nonlinear_call`: the positions of arguments (single arrays, after
    the fixed ones) in which the function is jointly linear, so that it transposes in
    them, through its VJP."""
    return _decorator("nonlinear_op", "nonlinear", shape, name, replace, fixed, vectorized, options)
