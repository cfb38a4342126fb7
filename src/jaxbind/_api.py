"""The public entry points: get_linear_call, get_nonlinear_call and the ops they return."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Unpack

import jax
import jax.numpy as jnp

from ._binding import Binding, register
from ._compat import register_cache
from ._errors import about, words
from ._kwargs import KwargsDump, encode_kwargs
from ._options import OPTION_DOCS, CallOptions, Options, declare, state_key_positions
from ._pickling import caller_module, reduce
from ._primitive import IMPL_CALLS, PRIMITIVE, bind, eager, nested
from ._roles import Body, Kind, OpBase, Reference, role_table
from ._rules.partitioning import check_declaration
from ._sites import forget_orphans
from ._spec import CallSpec

__all__ = ["Op", "get_linear_call", "get_nonlinear_call"]

_CALLABLE_CONTRACT = """
    Every callable has the signature ``f(out, args, kwargs_dump)``:

    - ``args`` is a tuple of read-only NumPy arrays, the inputs; do not modify them.
    - ``out`` is a tuple of writable NumPy arrays, one per output, shaped as the
      abstract function says. Write every element of every output in place
      (``out[0][...] = ...``); an output left unwritten holds garbage. Return nothing.
    - ``kwargs_dump`` carries the keyword arguments of the call; read them with
      ``jaxbind.load_kwargs(kwargs_dump)``.
    - The arrays are views of XLA's buffers, valid only during the call: keep no
      reference to them (copy what you need).

    Abstract functions have the signature ``abstract(*args, **kwargs)``: ``args``
    are shaped arrays (``.shape``, ``.dtype``), ``kwargs`` the keyword arguments.
    They return a tuple with one ``(shape, dtype)`` per output, or
    ``(shape, dtype, out_batch_axis)`` when ``func_can_batch`` is set.
"""


class Op(OpBase):
    """A jaxbind op: call it like a JAX function; it returns a list of arrays.

    Attributes:
      name: the binding's name. jaxprs show it in the parameter of the primitive
        (``jaxbind[spec=<name>:<role>]``), HLO metadata and profiles in ``op_name``.
      primitive: the ``jax.extend.core.Primitive`` it binds, ``jaxbind``, shared by
        every op.
    """

    def __init__(self, binding: Binding):
        self.binding = binding
        self._home: str | None = None  # the module that made it (get_*_call's caller)
        # Jitted binds for eager calls, per call site. Held by the op, not the
        # binding: their executables keep the binding alive, so a cache on the
        # binding would be a cycle through XLA that the garbage collector cannot
        # see, and dropped bindings would keep their executables.
        self._eager_calls: dict = {}
        _EAGER_CACHES.ops.add(self)

    @property
    def name(self) -> str:
        return self.binding.name

    @property
    def primitive(self):
        return PRIMITIVE

    def __repr__(self):
        return f"<jaxbind {self.binding.kind.value} op '{self.binding.name}'>"

    def __reduce__(self):
        """Pickled by reference, as a function is: the module that made it (or its
        function's) and its name there (see _pickling)."""
        f = self.binding.roles["f"].body
        return reduce(self, self.name, [(self._home, None), (getattr(f, "__module__", None), None)])

    def __copy__(self):  # an op is its name's definition: copies are itself, as for functions
        return self

    def __deepcopy__(self, memo):
        return self

    def __call__(self, /, *args, **kwargs) -> list[jax.Array]:
        # Fast path, the common eager call: no keyword arguments, all inputs
        # concrete JAX arrays. It skips building a CallSpec (see _primitive.eager).
        if not kwargs:
            for a in args:
                if not isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer):
                    break
            else:
                if len(args) > self.binding.options.fixed:
                    try:
                        return self._eager_plain(*args)
                    except RecursionError as exc:
                        return nested(self._eager_calls, self._eager_plain_spec, exc, args)
        return self.apply(args, kwargs)

    def apply(self, args, kwargs: dict, trees: KwargsDump | None = None) -> list[jax.Array]:
        """Apply the op to `args` with keyword arguments `kwargs`; `trees`: the call's
        pytree structure (pytree API, see CallSpec.trees)."""
        binding = self.binding
        if len(args) <= binding.options.fixed:
            raise TypeError(
                f"{about(binding.name)} got {len(args)} positional arguments but has "
                f"{words(binding.options).fixed}={binding.options.fixed}; it needs at least "
                "one more"
            )
        if binding.options.vectorized and "batch_axes" in kwargs:
            raise TypeError(
                f"{about(binding.name)}: the keyword argument 'batch_axes' is "
                "reserved for jaxbind's batching protocol"
            )
        dump = encode_kwargs(kwargs, where=f"'{binding.name}'") if kwargs else _NO_KWARGS
        args = [
            a if isinstance(a, jax.Array) else _as_array(binding.name, i, a)
            for i, a in enumerate(args)
        ]
        spec = CallSpec(binding, "f", binding.options.fixed, dump, trees=trees)
        if any(isinstance(a, jax.core.Tracer) for a in args):
            return bind(spec, *args)
        try:
            return eager(self._eager_calls, spec)(*args)
        except RecursionError as exc:
            return nested(self._eager_calls, spec, exc, args)

    @functools.cached_property
    def _eager_plain_spec(self) -> CallSpec:
        binding = self.binding
        return CallSpec(binding, "f", binding.options.fixed, _NO_KWARGS)

    @functools.cached_property
    def _eager_plain(self):
        return eager(self._eager_calls, self._eager_plain_spec)


def _as_array(name: str, index: int, value):
    """A positional argument as a JAX array, or an error that says what it is instead."""
    if isinstance(value, jax.ShapeDtypeStruct):
        raise TypeError(
            f"{about(name)}: argument {index} is a jax.ShapeDtypeStruct, which "
            "has a shape but no values; pass an array, or use jax.eval_shape(op, "
            "...) for the output shapes"
        )
    try:
        array = jnp.asarray(value)
    except TypeError as exc:
        raise TypeError(
            f"{about(name)}: argument {index} ({type(value).__name__}) is not an array: {exc}"
        ) from None
    return array


class _EagerCaches:
    """Every op's eager programs, cleared by ``jax.clear_caches()`` like JAX's own (and
    with them the sites no program is known to hold: `forget_orphans`)."""

    def __init__(self):
        self.ops: weakref.WeakSet = weakref.WeakSet()

    def cache_clear(self) -> None:
        forget_orphans()
        IMPL_CALLS.clear()
        for op in list(self.ops):
            op._eager_calls.clear()
            op.__dict__.pop("_eager_plain", None)

    def cache_info(self):
        return sum(len(op._eager_calls) for op in list(self.ops))

    def cache_keys(self):
        return [k for op in list(self.ops) for k in op._eager_calls]


_EAGER_CACHES = _EagerCaches()
register_cache(_EAGER_CACHES, "jaxbind: eager calls of each op")


_NO_KWARGS = encode_kwargs({})


def check_body_runs(what: str, fn, name, options: Options) -> None:
    """A generator or async function returns without running its body: its results
    would never be written. Refused here, as the trampoline refuses a return value."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if options.state is not None and Body.of(fn).compiled:  # it must see the state
        fn.check_state(f"jaxbind: {what} of '{name or _default_name(fn)}'", options.state)
    if (
        inspect.isgeneratorfunction(target)
        or inspect.iscoroutinefunction(target)
        or inspect.isasyncgenfunction(target)
    ):
        raise TypeError(
            f"jaxbind: {what} of '{name or getattr(target, '__qualname__', target)}' is a "
            f"{'generator' if inspect.isgeneratorfunction(target) else 'coroutine'} function: "
            "calling it returns without running its body, so it would never write its "
            f"results. {words(options).callable_contract}"
        )


def _default_name(f) -> str:
    """``module.qualname`` of the function (a numba kernel's Python function; a kernel of
    another kind by its own name, ``kernel.<name>``), not of the kernel's class."""
    if Body.of(f).compiled:
        fn = getattr(f, "_fn", None)
        if fn is None:
            return f"kernel.{f.name}"
        f = fn
    return (
        f"{getattr(f, '__module__', None) or 'unknown'}."
        f"{getattr(f, '__qualname__', None) or type(f).__qualname__}"
    )


def make_op(
    kind: Kind,
    f,
    transposes,
    derivatives,
    abstract,
    abstract_T,
    options: Options,
    name: str | None,
    replace: bool,
    reference: Reference | None = None,
) -> Op:
    """The op of a binding made from the user's functions and checked options (both
    APIs end here). `reference`: the op's JAX reference (see `reference_of`), or None."""
    if not callable(f):
        raise TypeError(f"jaxbind: f must be callable, got {f!r}")
    for what, fn in (
        ("f", f),
        *(
            ((f"f_T[{i}]" if isinstance(transposes, tuple) else "f_T"), t)
            for i, t in enumerate(transposes if isinstance(transposes, tuple) else (transposes,))
        ),
        *zip(("f_jvp", "f_vjp"), derivatives or ()),
    ):
        check_body_runs(what, fn, name, options)
    if not callable(abstract):
        raise TypeError(f"jaxbind: abstract must be callable, got {abstract!r}")
    for shape in abstract_T if isinstance(abstract_T, tuple) else (abstract_T,):
        if shape is not None and not callable(shape):
            raise TypeError(
                f"jaxbind: the abstract functions of the transposes (or the VJP) must be "
                f"callables or None, got {shape!r}"
            )
    explicit = name is not None
    if explicit and (not isinstance(name, str) or not name):
        raise TypeError(f"jaxbind: name must be a non-empty string, got {name!r}")
    if name is None:
        name = _default_name(f)
    roles = role_table(kind, f, transposes, derivatives, abstract, abstract_T, reference)
    if options.vectorized and any(r.kind.compiled for r in roles.values()):
        raise TypeError(f"{about(name)} has {words(options).kernel_batching()}")
    f_body = roles["f"].body
    if options.aliases and roles["f"].kind.compiled and f_body.reduction is not None:
        aliases = ", ".join(f"{i}: {o}" for i, o in options.aliases)
        raise ValueError(
            f"{about(name)}: input_output_aliases={{{aliases}}} lets outputs share inputs' "
            f"memory, but the function is kernel {f_body.name} with "
            f"reduction={f_body.reduction!r}, which zeroes its outputs before its ranges add "
            "into them: the inputs' values would be lost, and the result would hold only "
            "the ranges' sum. Drop input_output_aliases (add the input to the op's result "
            "afterwards if the sum should include it)"
        )
    check_state_key(name, options, roles)
    check_declaration(name, options, roles)
    binding = Binding(name=name, kind=kind, roles=roles, options=options)
    binding, _ = register(binding, explicit_name=explicit, replace=replace)
    return Op(binding)


def reference_of(given, prefer: tuple[str, ...], name: str, options: Options) -> Reference | None:
    """The op's `Reference` from what its definition gives (both APIs): ``reference=``
    (a function, or a Reference; None: none yet) and ``prefer_reference=`` (`prefer`, the
    checked platforms), which may state the same platforms as the Reference, not others.
    A reference is a function (of JAX arrays), and the op computes only outputs."""
    if given is None:
        return None
    function = given.function if isinstance(given, Reference) else given
    if not callable(function) or Body.of(function).compiled:
        raise TypeError(
            f"{about(name)}: reference must be a JAX function of the op's arrays and keyword "
            f"arguments that returns its outputs (or a jaxbind.Reference of one), got {given!r}"
        )
    if options.effect is not None:
        raise TypeError(
            f"{about(name)} has side effects "
            f"({'ordered=True' if options.effect == 'ordered' else 'has_side_effect=True'}), "
            "and a JAX "
            "reference computes outputs only: the effect would be lost where the reference "
            "runs. Drop reference=, or the side effect"
        )
    if not isinstance(given, Reference):
        return Reference(given, platforms=prefer)
    if prefer and given.platforms and prefer != given.platforms:
        raise ValueError(
            f"{about(name)}: prefer_reference={prefer} and its jaxbind.Reference's "
            f"platforms={given.platforms} say different things; give the platforms once "
            "(Reference(..., platforms=) or prefer_reference=)"
        )
    return given.replace(platforms=prefer) if prefer else given


def no_reference_preferred(name: str, prefer: tuple[str, ...], options: Options) -> None:
    """An op that prefers its reference (``prefer_reference=``) must have one: refused
    when it is defined (get_*_call) or first called (the decorators' def_reference)."""
    if prefer:
        raise TypeError(
            f"{about(name)} has prefer_reference={prefer} but no JAX reference to run "
            f"there; give it one ({words(options).give_reference()}), or drop prefer_reference"
        )


def check_state_key(name: str, options: Options, roles: dict) -> None:
    """Every role whose body runs at call time (a callable or a kernel) receives the
    state's key inputs, where its run time looks for them (RoleDef.positions); a role
    given as a JAX function calls other ops, and needs none."""
    sdef = options.state
    if sdef is None or not options.state_key:
        return
    for entry in roles.values():
        if entry.body is None or entry.kind.traced:
            continue
        for k, p, at in zip(
            sdef.key, options.state_key, entry.positions(options.state_key, options.fixed)
        ):
            if at is None:
                raise TypeError(
                    f"{about(name, entry.role.text)}: its state's key input {k!r} (argument "
                    f"{p}) is not among the arguments {entry.role.describe()} receives "
                    f"({entry.args.value[0]}), so its setup could not be given {k!r} there. "
                    f"Make {k!r} a fixed argument ({words(options).fixed}=), or give "
                    f"{entry.role.describe()} a JAX-function body (jaxbind.jax_function), "
                    "which runs no setup"
                )


def get_linear_call(
    f: Callable,
    f_T: Callable | Sequence[Callable | None] | None,
    /,
    abstract: Callable,
    abstract_T: Callable | Sequence | None = None,
    *,
    reference: Callable | Reference | None = None,
    **options: Unpack[CallOptions],
) -> Op:
    """Make a JAX op from a linear (or multilinear) Python function and its transpose.

    Args:
      f: the function; linear in every argument after the first ``first_n_args_fixed``.
      f_T: its transpose, called with the fixed arguments followed by the
        cotangents of f's outputs, writing the cotangents of f's other arguments.
        A tuple with one transpose per argument (``None`` where there is none)
        makes a multilinear op, linear in each argument separately; its i-th
        transpose is called with all arguments except the i-th, followed by the
        cotangents, and writes the cotangent of argument i.
      abstract: output shapes and dtypes of ``f`` from its shaped arguments.
      abstract_T: the same for ``f_T`` (a tuple for a multilinear op), or None
        (for any of them): the cotangents are shaped as the inputs they belong to,
        which jaxbind knows from the primals.
      reference: the op's JAX reference, ``reference(*args, **kwargs)`` with JAX arrays,
        returning f's outputs (see "Options" below); then ``f_T`` may be None, and
        the transpose is derived from it.
      **options: ``first_n_args_fixed``, ``func_can_batch``, ``name``, ``replace``,
        ``platform_mode``, ``input_output_aliases``, ``has_side_effect``, ``ordered``,
        ``state``, ``sharding``, ``reduction``, ``prefer_reference``: see "Options" below.

    Returns:
      An [`Op`][jaxbind.Op]. It supports ``jit``, ``jvp``, ``grad``/``vjp``,
      ``linear_transpose`` and ``vmap``; linear ops differentiate to any order.
    """
    kind = Kind.LINEAR
    if isinstance(f_T, (tuple, list)):
        kind = Kind.MULTILINEAR
        f_T = tuple(f_T)
        if abstract_T is None:
            abstract_T = (None,) * len(f_T)
        if not isinstance(abstract_T, (tuple, list)) or len(abstract_T) != len(f_T):
            raise TypeError(
                "jaxbind: with a tuple of transposes f_T, abstract_T must be None or a "
                f"tuple of the same length ({len(f_T)})"
            )
        abstract_T = tuple(abstract_T)
    elif f_T is not None and not callable(f_T):
        raise TypeError(f"jaxbind: f_T must be callable, a tuple of callables or None, got {f_T!r}")
    checked, name, replace, prefer = declare(
        "get_linear_call", kind.value, options, pytree_api=False, default_name=_default_name(f)
    )
    checked = state_key_positions(
        checked, abstract, name or _default_name(f), "its abstract function"
    )
    ref = _reference_13(reference, prefer, name or _default_name(f), checked)
    op = make_op(kind, f, f_T, None, abstract, abstract_T, checked, name, replace, ref)
    op._home = caller_module(1)  # where a pickle looks for it by name
    return op


def get_nonlinear_call(
    f: Callable,
    f_derivative: Sequence[Callable | None],
    /,
    abstract: Callable,
    abstract_reverse: Callable | None = None,
    *,
    reference: Callable | Reference | None = None,
    **options: Unpack[CallOptions],
) -> Op:
    """Make a JAX op from a nonlinear Python function with its JVP and VJP.

    Args:
      f: the function.
      f_derivative: ``(f_jvp, f_vjp)``. ``f_jvp`` is called with all arguments
        of f followed by the tangents of the non-fixed ones and writes the
        tangents of f's outputs. ``f_vjp`` is called with all arguments of f
        followed by the cotangents of f's outputs and writes the cotangents of
        the non-fixed arguments. Either may be ``None`` (no forward / reverse mode).
        Either may also be a JAX function instead of a callable: a jaxbind op, or
        a function marked with [`jaxbind.jax_function`][jaxbind.jax_function], called with the same
        arguments as JAX arrays (and the keyword arguments) and returning the list
        of results. Such derivatives are differentiable in turn, so the op has
        second (and higher) derivatives, as far as the JAX functions do.
      abstract: output shapes and dtypes of ``f`` (and so of ``f_jvp``).
      abstract_reverse: output shapes of ``f_vjp``, called with f's arguments
        followed by the cotangents; None: they are shaped as the non-fixed
        arguments, which jaxbind knows from the primals.
      reference: the op's JAX reference, ``reference(*args, **kwargs)`` with JAX arrays,
        returning f's outputs (see "Options" below); a JVP or VJP given as None is then
        derived from it, differentiable to any order.
      **options: as for [`get_linear_call`][jaxbind.get_linear_call], and ``linear_in``: see
        "Options" below.

    Returns:
      An [`Op`][jaxbind.Op], differentiable in forward and reverse mode: to first order
      with callables as derivatives, further with JAX functions.
    """
    if not isinstance(f_derivative, (tuple, list)) or len(f_derivative) != 2:
        raise TypeError("jaxbind: f_derivative must be a pair (f_jvp, f_vjp)")
    for what, fn in zip(("f_jvp", "f_vjp"), f_derivative):
        if fn is not None and not callable(fn):
            raise TypeError(f"jaxbind: {what} must be callable or None, got {fn!r}")
    checked, name, replace, prefer = declare(
        "get_nonlinear_call", "nonlinear", options, pytree_api=False, default_name=_default_name(f)
    )
    checked = state_key_positions(
        checked, abstract, name or _default_name(f), "its abstract function"
    )
    ref = _reference_13(reference, prefer, name or _default_name(f), checked)
    derivatives = tuple(f_derivative)
    op = make_op(
        Kind.NONLINEAR,
        f,
        None,
        derivatives,
        abstract,
        abstract_reverse,
        checked,
        name,
        replace,
        ref,
    )
    op._home = caller_module(1)  # where a pickle looks for it by name
    return op


def _reference_13(reference, prefer: tuple[str, ...], name: str, options: Options):
    """The JAXbind 1.3 API's reference: given with the op, or never."""
    if reference is None:
        no_reference_preferred(name, prefer, options)
    return reference_of(reference, prefer, name, options)


for _fn in (get_linear_call, get_nonlinear_call):
    if _fn.__doc__ is not None:  # None under python -OO, which strips docstrings
        _fn.__doc__ += OPTION_DOCS + _CALLABLE_CONTRACT
