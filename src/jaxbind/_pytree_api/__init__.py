"""The pytree API: ops defined as ``jax.custom_vjp`` and ``torch.library.custom_op`` are.

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
sharding, GPU, ``jaxbind.testing.check``). This package only translates (the op and its
decorators here; the call's pytree structure in `trees`; the bodies in `bodies`):

- arguments and results are pytrees of arrays; their structure is a field of the
  call (CallSpec.trees, the ``trees`` attribute of call format 3: the pytrees with 0
  for every array), as JAX keeps ``in_tree``, so programs stay exportable when the
  structures are made of tuples, lists, dicts and None. Each body and the shape
  function take it through ``for_trees`` (see _roles.for_call), which groups the
  flat arrays of each role (layout) into the user's pytrees;
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
import weakref
from collections.abc import Callable
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from .._api import Op, check_state_key, make_op, no_reference_preferred, reference_of
from .._errors import about, add_context, refused_arguments
from .._kwargs import KwargsDump, encode_kwargs
from .._options import OPTION_DOCS, OpOptions, Options, declare, state_key_positions
from .._pickling import reduce
from .._roles import (
    Args,
    Body,
    JaxFunction,
    Kind,
    Reference,
    is_jax_function,
    jax_function,
    role_table,
)
from .bodies import JaxDerivative, Shapes, body, check_declared
from .trees import _tree_numbered, call_trees, structures  # noqa: F401 (pickles name it here)

__all__ = ["PytreeOp", "linear_op", "multilinear_op", "nonlinear_op"]

ShapeFn = Callable[..., Any]
# The keys of its eager programs among the op's: _EAGER without keyword arguments, else
# (_EAGER, their dump)
_EAGER = "eager call"
_NO_KWARGS = encode_kwargs({})


class PytreeOp:
    """An op of the pytree API (made by [`linear_op`][jaxbind.linear_op],
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
        reference: Callable | Reference | None = None,
        prefer_reference: tuple[str, ...] = (),
    ):
        if not callable(fn) or not callable(shape):
            raise TypeError("jaxbind: the function and its shape must be callables")
        self.kind, self.fn, self.shape, self.options = kind, fn, shape, options
        self.fixed, self.vectorized = options.fixed, options.vectorized
        self._explicit_name, self._replace = name, replace
        self._transposes: dict[int | None, Callable] = {}
        self._jvp: Callable | None = None
        self._vjp: Callable | None = None
        self._prefer = prefer_reference  # the reference's platforms, until it is given
        self._reference = self._wrapped_reference(reference)
        self._called = False
        functools.update_wrapper(self, fn, updated=())
        self._shapes = Shapes(self, shape, Args.F, "the shape function")
        # Registered now, so that a process that only imports the op can run exported
        # programs that call it; def_* fill in the derivatives before the first call.
        self._op: Op = self._make()
        self.name = self._op.name  # the default, or "#2"... after a clash of default names

    def __repr__(self):
        return f"<jaxbind pytree-API {self.kind} op '{self.name}'>"

    def __reduce__(self):
        """Pickled by reference, as the function it decorates would be: its module and
        qualified name (see _pickling)."""
        qualname = getattr(self, "__qualname__", None)  # (the function's, update_wrapper)
        return reduce(self, self.name, [(self.__module__, qualname)])

    def __copy__(self):  # an op is its name's definition: copies are itself, as for functions
        return self

    def __deepcopy__(self, memo):
        return self

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

    def def_reference(self, fn: Callable | Reference) -> Callable | Reference:
        """Define the op's JAX reference (decorator): ``fn(*args, **kwargs)`` with the op's
        arguments as JAX arrays (pytrees as given) returns the pytree its shape function
        describes, computing what the function computes. Programs for platforms without
        a native body run it, ``jaxbind.export(..., portable=True)`` exports it, the
        derivatives and transposes not defined are derived from it, and
        ``jaxbind.testing.check`` compares the function with it. `fn` may be a
        ``jaxbind.Reference`` (with a tolerance, or the platforms where it is preferred)."""
        self._define("reference")
        self._reference = self._wrapped_reference(fn)
        self._refresh()
        return fn

    def _wrapped_reference(self, given) -> Reference | None:
        """The user's reference as the op's `Reference`, checked as both APIs check it,
        its function taking pytrees."""
        name = getattr(self, "name", None) or self._explicit_name
        name = str(name or getattr(self.fn, "__qualname__", "op"))
        value = reference_of(given, self._prefer, name, self.options)
        if value is None:
            return None
        return value.replace(function=JaxDerivative(self, value.function, Args.F, "the reference"))

    def _check_nonlinear(self, what):
        if self.kind != "nonlinear":
            raise TypeError(f"{about(self.name)} is {self.kind}: use def_transpose, not {what}")

    # --- the binding -------------------------------------------------------------------
    def _transposes_now(self):
        if self.kind == "linear":
            t = self._transposes.get(None)
            return body(self, t, Args.T, "the transpose") if t is not None else None
        n = max((i for i in self._transposes if i is not None), default=-1) + 1
        return tuple(
            body(
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
                derivatives.append(jax_function(JaxDerivative(self, inner, args, what)))
            else:
                derivatives.append(body(self, fn, args, what))
        return tuple(derivatives)

    def _bodies(self) -> tuple[Any, Any, Any]:
        """(f, transposes, derivatives) as defined so far."""
        f = self.__dict__.get("_f") or body(self, self.fn, Args.F, "the function")
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
            self._reference,
        )

    def _refresh(self):
        """Give the registered binding the derivatives defined so far (before any call)."""
        binding = self._op.binding
        roles = role_table(binding.kind, *self._bodies(), self._shapes, None, self._reference)
        check_state_key(self.name, self.options, roles)
        binding.roles = roles

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
        if not self._called:
            self._first_call()
        for i in range(min(self.fixed, len(args))):
            if jax.tree.structure(args[i]).num_leaves != 1 or not jax.tree_util.treedef_is_leaf(
                jax.tree.structure(args[i])
            ):
                raise TypeError(
                    f"{about(self.name)}: fixed argument {i} must be one array, not a pytree"
                )
        keyed = self.options.state_key
        for i in range(max(keyed, default=-1) + 1):
            if i < len(args) and not jax.tree_util.treedef_is_leaf(jax.tree.structure(args[i])):
                raise TypeError(
                    f"{about(self.name)}: argument {i} must be one array, not a pytree: its "
                    f"state's key inputs (arguments {keyed}) are found by their position, "
                    "and every argument up to the last of them must be one array. Pass it "
                    "as separate arrays, or move the key inputs before it"
                )
        leaves, in_tree = jax.tree.flatten(args)
        leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in leaves]
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
        shape_args = jax.tree.unflatten(in_tree, specs)
        try:
            declared = self.shape(*shape_args, **kwargs)
        except Exception as exc:
            refused = (
                refused_arguments(self.shape, shape_args, kwargs, "shape=")
                if isinstance(exc, TypeError)
                else None
            )
            if refused is not None:
                problem, fix, keywords = refused
                gets = (
                    "A call's keyword arguments go to the shape function as well as to the function"
                    if keywords
                    else "It gets the call's positional arguments, as jax.ShapeDtypeStruct"
                )
                raise TypeError(
                    f"jaxbind: the shape function of '{self.name}' {problem}. {gets}: {fix}"
                ) from None
            raise add_context(exc, f"jaxbind: the shape function of '{self.name}' failed") from None
        check_declared(self.name, declared, self.options.effect is not None)
        out_tree = jax.tree.structure(declared)
        return leaves, kwargs, call_trees(in_tree, out_tree)

    def _first_call(self) -> None:
        """Defined for good: an op that prefers its reference has one."""
        if self._reference is None:
            no_reference_preferred(self.name, self._prefer, self.options)

    def __call__(self, *args, **kwargs):
        if not self._called:
            self._first_call()
            self._called = True
        # An eager call, every argument a concrete JAX array or a pytree of them: one jitted
        # call of `_traced` per set of keyword arguments does it all. JAX's C++ dispatch
        # finds the program by the arguments' types; the shape function and the pytrees
        # run only when it traces a new one. Keyword arguments are told apart by their
        # encoding (as the 1.3 API's calls are: 1 and 1.0 differ). First the commonest
        # call, as Op.__call__ takes it: arrays, no keyword arguments.
        if not kwargs:
            for a in args:
                if not isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer):
                    break
            else:
                if len(args) > self.fixed:
                    eager = self._op._eager_calls.get(_EAGER) or self._eager_call(kwargs)
                    try:
                        return eager(*args)
                    except RecursionError as exc:  # nested eager calls: _primitive.nested
                        if not str(exc).startswith("Recursively calling jit"):
                            raise
                        return self._traced(*args)
        if len(args) > self.fixed and all(_concrete(a) for a in args):
            eager = self._eager_call(kwargs)
            if eager is not None:
                try:
                    return eager(*args)
                except RecursionError as exc:  # nested eager calls: see _primitive.nested
                    if not str(exc).startswith("Recursively calling jit"):
                        raise
        return self._traced(*args, **kwargs)

    def _traced(self, *args, **kwargs):
        leaves, kwargs, trees = self.protocol_call(*args, **kwargs)
        results = self._op.apply(leaves, kwargs, trees)
        return structures(trees)[1].unflatten(results)

    def _eager_call(self, kwargs: dict):
        """The jitted call of `_traced` with these keyword arguments, kept with the op's
        eager programs (cleared with them: jax.clear_caches()); None for keyword arguments
        that do not encode (the call then reports them as any call does)."""
        if kwargs:
            try:
                dump = encode_kwargs(kwargs, where=f"'{self.name}'")
            except Exception:
                return None
        else:
            dump = _NO_KWARGS
        calls = self._op._eager_calls
        key = (_EAGER, dump) if kwargs else _EAGER
        fn = calls.get(key)
        if fn is not None:
            return fn
        op = weakref.ref(self)  # (the op's programs do not keep it alive)

        def traced(*args):
            alive = op()
            assert alive is not None  # (only its own calls run this program)
            return alive._traced(*args, **dump.to_dict())

        traced.__name__ = traced.__qualname__ = self.name
        traced._apply_primitive = True  # type: ignore[attr-defined]  # as _primitive.eager's
        if len(calls) >= 64:  # as _primitive.eager bounds them
            calls.clear()
        fn = calls[key] = jax.jit(traced)
        return fn


def _concrete(arg) -> bool:
    """Whether an argument is a concrete JAX array, or a pytree of them (not traced)."""
    if isinstance(arg, jax.Array):
        return not isinstance(arg, jax.core.Tracer)
    return all(
        isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        for x in jax.tree.leaves(arg)
    )


Decorator = Callable[[Callable], "PytreeOp"]


def _decorator(
    kind: str, shape: ShapeFn, reference: Callable | Reference | None, options: OpOptions
) -> Decorator:
    checked, name, replace, prefer = declare(f"{kind}_op", kind, options, pytree_api=True)

    def make(fn: Callable) -> PytreeOp:
        where = str(name or getattr(fn, "__qualname__", "op"))
        # (a kernel's function takes its outputs first: the shape function names the
        # op's arguments)
        if Body.of(fn).compiled:
            keyed = state_key_positions(checked, shape, where, "the op's shape function")
        else:
            keyed = state_key_positions(checked, fn, where, "the op's function")
        return PytreeOp(
            kind,
            fn,
            shape,
            name=name,
            replace=replace,
            options=keyed,
            reference=reference,
            prefer_reference=prefer,
        )

    return make


def linear_op(
    *, shape: ShapeFn, reference: Callable | Reference | None = None, **options: Unpack[OpOptions]
) -> Decorator:
    """Decorator: a linear op (linear in every argument after the first ``fixed``).

    Args:
      shape: ``shape(*args, **kwargs)`` with ``jax.ShapeDtypeStruct``-like arguments,
        returning the output's ``jax.ShapeDtypeStruct`` (or a pytree of them).
      reference: the op's JAX reference (or ``@op.def_reference``): ``reference(*args,
        **kwargs)`` with JAX arrays returns what the function returns. It runs where
        the function cannot (other platforms, portable exports), and derives the
        derivatives not defined; see "Options" below.
      **options: the options of both APIs (listed under "Options" below, as for
        [`jaxbind.get_linear_call`][jaxbind.get_linear_call]), with two under their own
        names here: ``fixed``, the leading arguments that are parameters (single
        arrays), not linear inputs; ``vectorized``, the callables
        handle batches themselves: batched arrays arrive with their batch axes in
        front, and results go back the same way. ``input_output_aliases`` counts array
        leaves; with ``state``, every body gets the object as its ``state`` argument.

    The decorated function gets NumPy arrays (pytrees as given) and the keyword
    arguments, and returns its result, or writes into ``out=`` if it takes that
    argument. Define the transpose with ``@op.def_transpose``.
    """
    return _decorator("linear", shape, reference, options)


def multilinear_op(
    *, shape: ShapeFn, reference: Callable | Reference | None = None, **options: Unpack[OpOptions]
) -> Decorator:
    """Decorator: an op linear in each argument separately (e.g. a product).

    As [`linear_op`][jaxbind.linear_op]; define one transpose per argument with
    ``@op.def_transpose(argnum=i)``.
    """
    return _decorator("multilinear", shape, reference, options)


def nonlinear_op(
    *, shape: ShapeFn, reference: Callable | Reference | None = None, **options: Unpack[OpOptions]
) -> Decorator:
    """Decorator: a nonlinear op. As [`linear_op`][jaxbind.linear_op]; define its derivatives with
    ``@op.def_jvp`` and ``@op.def_vjp`` (callables, or functions marked with
    ``jaxbind.jax_function``, for second derivatives). Its options include ``linear_in``, as for
    [`jaxbind.get_nonlinear_call`][jaxbind.get_nonlinear_call]: the positions of arguments
    (single arrays, after the fixed ones) in which the function is jointly linear, so that it
    transposes in them, through its VJP."""
    return _decorator("nonlinear", shape, reference, options)


for _fn in (linear_op, multilinear_op, nonlinear_op):
    if _fn.__doc__ is not None:  # None under python -OO, which strips docstrings
        _fn.__doc__ += OPTION_DOCS
