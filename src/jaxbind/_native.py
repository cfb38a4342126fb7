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

- arguments and results are pytrees of arrays; their structure is a field of the
  call (CallSpec.trees, the ``trees`` attribute of call format 3: the pytrees with 0
  for every array), as JAX keeps ``in_tree``, so programs stay exportable when the
  structures are made of tuples, lists, dicts and None. Each body and the shape
  function take it through ``for_trees`` (see _roles.for_call), which groups the
  flat arrays of each role (_layout) into the user's pytrees;
- shapes are ``jax.ShapeDtypeStruct`` pytrees returned by ``shape``; those of
  transposes and VJPs come from the primals (see CallSpec.out_hint), as they may
  in the other API;
- a callable either returns its results, which jaxbind copies into XLA's
  buffers, or, if it takes an ``out=`` keyword argument, writes into them;
- ``vectorized=True``: the callables get every batched array with its batch axes
  in front (outermost vmap first) and return results laid out the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Unpack

import jax
import jax.numpy as jnp
import numpy as np

from ._api import Op, check_body_runs, make_op
from ._avals import shown
from ._errors import about, add_context
from ._kernels import Kernel
from ._kwargs import KwargsDump, encode_kwargs, load_kwargs
from ._options import OpOptions, Options, declare
from ._roles import Args, JaxFunction, Kind, is_jax_function, jax_function, role_table
from ._spec import BatchAxes

__all__ = ["NativeOp", "linear_op", "multilinear_op", "nonlinear_op"]

ShapeFn = Callable[..., Any]


def _skeleton(tree) -> Any:
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
    skeleton = _skeleton(tree)
    return skeleton if _plain(skeleton) else _Tree.of(tree)


def _structure(skeleton) -> Any:
    if isinstance(skeleton, _Tree):
        return skeleton.treedef
    try:
        return _structure_of((repr(skeleton), skeleton))
    except TypeError:  # an unhashable skeleton (lists, dicts): no cache
        return jax.tree.structure(skeleton)


@functools.lru_cache(maxsize=4096)
def _call_trees(in_tree, out_tree) -> KwargsDump:
    """A call's pytree structure (CallSpec.trees): its arguments' and its results'."""
    return encode_kwargs({"in": _token(in_tree), "out": _token(out_tree)}, where="pytree")


def _structures(trees: KwargsDump) -> tuple:
    """(argument tree, result tree) of a call from its CallSpec.trees."""
    values = trees._values
    return _structure(values["in"]), _structure(values["out"])


def _check_declared(name: str, declared, effectful: bool) -> None:
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


def _takes_out(fn: Callable) -> bool:
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _split(leaves, trees):
    """Unflatten consecutive runs of `leaves` into the pytrees `trees`."""
    out, pos = [], 0
    for tree in trees:
        out.append(jax.tree.unflatten(tree, leaves[pos : pos + tree.num_leaves]))
        pos += tree.num_leaves
    return out


# --- argument layouts: the pytrees each role takes, from the call's structure -------------


def _tangents(args, fixed: int):
    lin = args[fixed:]
    return jax.tree.structure(tuple(_skeleton(t) for t in lin))


def _layout(args_of: Args, ins, outs, fixed: int, index: int | None):
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


class _Body:
    """One body or shape function of a native op, made for calls by `for_trees`: the call's
    pytree structure decides how its flat arrays are grouped into the user's pytrees."""

    def __init__(self, native: NativeOp, fn: Callable, args: Args, what: str, index=None):
        self.native, self.fn, self.args, self.what, self.index = native, fn, args, what, index
        functools.update_wrapper(self, fn, updated=())

    def trees(self, trees: KwargsDump):
        ins, outs = _structures(trees)
        return _layout(self.args, ins, outs, self.native.fixed, self.index)

    def __call__(self, *args, **kwargs):
        raise TypeError(
            f"{about(self.native.name)} ({self.what}) is called with the pytree structure of "
            "a call (for_trees), not directly"
        )


class _Callable(_Body):
    """A callable of a native op, as the trampoline calls it: (out, args, kwargs_dump)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.takes_out = _takes_out(self.fn)

    def for_trees(self, trees: KwargsDump) -> Callable:
        return functools.partial(self._run, *self.trees(trees))

    def _run(self, arg_trees, out_tree, out, args, kwargs_dump):
        kwargs = load_kwargs(kwargs_dump)
        batch = kwargs.pop("batch_axes", None)
        leaves = BatchAxes(batch).to_front(args, np.moveaxis) if batch else list(args)
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


def _body(native: NativeOp, fn, args: Args, what: str, index=None):
    """A callable wrapped for pytrees; a compiled kernel as it is (it takes flat arrays)."""
    if isinstance(fn, Kernel):
        return fn
    name = getattr(native, "name", None) or native._explicit_name or native.fn.__qualname__
    check_body_runs(what, fn, name, native.options)
    return _Callable(native, fn, args, what, index=index)


class _JaxDerivative(_Body):
    """A derivative given as a JAX function, for a native op (pytrees in and out)."""

    def for_trees(self, trees: KwargsDump) -> Callable:
        arg_trees, out_tree = self.trees(trees)

        def call(*leaves, **kwargs):
            return out_tree.flatten_up_to(self.fn(*_split(list(leaves), arg_trees), **kwargs))

        return call


class _Shapes(_Body):
    """The op's shape function as its abstract function (f's, and the JVP's at the primals)."""

    def for_trees(self, trees: KwargsDump) -> Callable:
        ins, outs = _structures(trees)
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
        declared = outs.flatten_up_to(self.fn(*_split(list(avals), ins.children()), **kwargs))
        if not batch_axes:
            return tuple((d.shape, d.dtype) for d in declared)
        return tuple((levels + tuple(d.shape), d.dtype, 0) for d in declared)


class NativeOp:
    """An op of the JAX-native API (made by [`linear_op`][jaxbind.linear_op],
    [`multilinear_op`][jaxbind.multilinear_op] or [`nonlinear_op`][jaxbind.nonlinear_op]).
    Call it with pytrees of arrays and static keyword arguments; it returns the pytree its
    ``shape`` function describes (one array for one output).

    Attributes:
      name: the binding's name, as jaxprs, HLO and exported programs show it.
      op: the underlying [`jaxbind.Op`][jaxbind.Op] (built at the first call).
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
        self._shapes = _Shapes(self, shape, Args.F, "the shape function")
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
    def _transposes_now(self):
        if self.kind == "linear":
            t = self._transposes.get(None)
            return _body(self, t, Args.T, "the transpose") if t is not None else None
        n = max((i for i in self._transposes if i is not None), default=-1) + 1
        return tuple(
            _body(
                self,
                self._transposes[i],
                Args.T_I,
                f"the transpose with respect to argument {i}",
                index=i,
            )
            if i in self._transposes
            else None
            for i in range(n)
        )

    def _derivatives_now(self):
        derivatives: list[Callable | None] = []
        for fn, args, what in ((self._jvp, Args.JVP, "the JVP"), (self._vjp, Args.VJP, "the VJP")):
            if fn is None:
                derivatives.append(None)
            elif is_jax_function(fn):
                inner = fn.fn if isinstance(fn, JaxFunction) else fn
                derivatives.append(jax_function(_JaxDerivative(self, inner, args, what)))
            else:
                derivatives.append(_body(self, fn, args, what))
        return tuple(derivatives)

    def _bodies(self) -> tuple[Any, Any, Any]:
        """(f, transposes, derivatives) as defined so far."""
        f = self.__dict__.get("_f") or _body(self, self.fn, Args.F, "the function")
        self._f = f
        if self.kind == "nonlinear":
            return f, None, self._derivatives_now()
        return f, self._transposes_now(), None

    def _make(self) -> Op:
        """The binding, registered now with the function alone; def_* add the rest. The
        shapes of transposes and VJPs come from the primals (no abstract function)."""
        return make_op(
            Kind(self.kind),
            *self._bodies(),
            self._shapes,
            None,
            self.options,
            self._explicit_name,
            self._replace,
        )

    def _refresh(self):
        """Give the registered binding the derivatives defined so far (before any call)."""
        binding = self._op.binding
        binding.roles = role_table(binding.kind, *self._bodies(), self._shapes, None)

    @property
    def op(self) -> Op:
        return self._op

    @property
    def binding(self):
        return self._op.binding

    def protocol_call(self, *args, **kwargs) -> tuple[list, dict, KwargsDump]:
        """The array arguments, keyword arguments and pytree structure (CallSpec.trees)
        with which this call applies the underlying op (see Op.apply; used by
        jaxbind.testing.check)."""
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
        _check_declared(self.name, declared, self.options.effect is not None)
        out_tree = jax.tree.structure(declared)
        return leaves, kwargs, _call_trees(in_tree, out_tree)

    def __call__(self, *args, **kwargs):
        self._called = True
        leaves, kwargs, trees = self.protocol_call(*args, **kwargs)
        results = self._op.apply(leaves, kwargs, trees)
        return jax.tree.unflatten(_structures(trees)[1], results)


Decorator = Callable[[Callable], "NativeOp"]


def _decorator(kind: str, shape: ShapeFn, options: OpOptions) -> Decorator:
    checked, name, replace = declare(f"{kind}_op", kind, options, native=True)

    def make(fn: Callable) -> NativeOp:
        return NativeOp(kind, fn, shape, name=name, replace=replace, options=checked)

    return make


def linear_op(*, shape: ShapeFn, **options: Unpack[OpOptions]) -> Decorator:
    """Decorator: a linear op (linear in every argument after the first ``fixed``).

    Args:
      shape: ``shape(*args, **kwargs)`` with ``jax.ShapeDtypeStruct``-like arguments,
        returning the output's ``jax.ShapeDtypeStruct`` (or a pytree of them).
      **options: the options of both APIs (see
        [`jaxbind.get_linear_call`][jaxbind.get_linear_call]), with two under their own
        names here: ``fixed``, the leading arguments that are parameters (single
        arrays), not linear inputs; ``vectorized``, the callables
        handle batches themselves: batched arrays arrive with their batch axes in
        front, and results go back the same way. ``name``, ``replace``,
        ``platform_mode``, ``input_output_aliases`` (indices of array leaves),
        ``has_side_effect`` and ``ordered`` are as in the other API.

    The decorated function gets NumPy arrays (pytrees as given) and the keyword
    arguments, and returns its result, or writes into ``out=`` if it takes that
    argument. Define the transpose with ``@op.def_transpose``.
    """
    return _decorator("linear", shape, options)


def multilinear_op(*, shape: ShapeFn, **options: Unpack[OpOptions]) -> Decorator:
    """Decorator: an op linear in each argument separately (e.g. a product).

    As [`linear_op`][jaxbind.linear_op]; define one transpose per argument with
    ``@op.def_transpose(argnum=i)``.
    """
    return _decorator("multilinear", shape, options)


def nonlinear_op(*, shape: ShapeFn, **options: Unpack[OpOptions]) -> Decorator:
    """Decorator: a nonlinear op. As [`linear_op`][jaxbind.linear_op]; define its derivatives with
    ``@op.def_jvp`` and ``@op.def_vjp`` (callables, or functions marked with
    ``jaxbind.jax_function``, for second derivatives). Its options include ``linear_in``, as for
    [`jaxbind.get_nonlinear_call`][jaxbind.get_nonlinear_call]: the positions of arguments
    (single arrays, after the fixed ones) in which the function is jointly linear, so that it
    transposes in them, through its VJP."""
    return _decorator("nonlinear", shape, options)
