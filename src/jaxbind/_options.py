"""Options: what an op declares besides its functions, one value for both APIs.

`get_linear_call` / `get_nonlinear_call` and the decorators `linear_op`,
`multilinear_op`, `nonlinear_op` take the same options, under the names each API
has always used for the fixed arguments and for vectorized batching
(``first_n_args_fixed`` / ``fixed``, ``func_can_batch`` / ``vectorized``), and
the same names for everything else. Both build one `Options` with `declare`,
which checks every value; a binding keeps it (``binding.options``), and every
rule reads it from there. An option added here exists in both APIs.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from ._roles import NATIVE_PLATFORMS, native_platforms
from ._sharding import RuleError, Sharding

__all__ = [
    "OPTION_DOCS",
    "OPTION_NAMES",
    "PLATFORM_MODES",
    "CallOptions",
    "OpOptions",
    "Options",
    "declare",
]

PLATFORM_MODES = ("device", "host")


@dataclass(frozen=True, slots=True)
class Options:
    """An op's options, checked.

    Attributes:
      fixed: how many leading arguments of the function are parameters (not
        differentiated, not transposed, not vectorized as inputs).
      vectorized: the callables handle batches themselves (vectorized batching).
      platform_mode: how GPU programs hand buffers to callables: "device" or "host".
      aliases: ((input, output), ...): outputs of the function that share an
        input's memory (``input_output_aliases``).
      effect: None, "unordered" (``has_side_effect``) or "ordered".
      linear_in: nonlinear ops: arguments in which the function is jointly linear.
      pytree_api: made by the pytree API (the decorators), not ``get_*_call``; every
        message about the op speaks that API (see _errors.words).
      state: what the op sets up once per call site (``@jaxbind.state``), or None.
      state_key: the positions of the state's ``key`` inputs among f's arguments (each
        role finds them in its own layout: _roles.RoleDef.positions).
      sharding: how the op's axes relate across its arguments and results (``sharding=``
        and ``reduction=``), as a value (_sharding.Sharding): a rule in einsum-like
        notation (``"m d, m -> g"``), parsed here, or a function of f's argument shapes
        and the call's keyword arguments that gives one per call; None: the op declares
        none. _rules.partitioning checks it against the op at creation (a function's
        rules at each call) and decides each call's partitioning by it.

    Where the op's JAX reference computes its calls (``prefer_reference=``) is not an
    option of the binding but part of its reference (_roles.Reference.platforms):
    `declare` checks it and hands it back beside the name.
    """

    fixed: int = 0
    vectorized: bool = False
    platform_mode: str = "device"
    aliases: tuple[tuple[int, int], ...] = ()
    effect: str | None = None
    linear_in: tuple[int, ...] = ()
    pytree_api: bool = False
    state: Any = None  # a _state.StateDef (not imported: this module imports none of jaxbind's)
    state_key: tuple[int, ...] = ()
    sharding: Sharding | None = None


class _CommonOptions(TypedDict, total=False):
    """The keyword options both APIs take under the same name (the ``**options`` of
    their signatures; `declare` checks them)."""

    name: str | None
    replace: bool
    platform_mode: str
    input_output_aliases: dict[int, int] | None
    has_side_effect: bool
    ordered: bool
    linear_in: Sequence[int]
    state: Any  # made with @jaxbind.state
    sharding: str | Callable[..., Any] | None
    reduction: Sequence[str]
    prefer_reference: Sequence[str]


class CallOptions(_CommonOptions, total=False):
    """The options of ``get_linear_call`` and ``get_nonlinear_call`` (JAXbind's names)."""

    first_n_args_fixed: int | None
    func_can_batch: bool


class OpOptions(_CommonOptions, total=False):
    """The options of the decorators ``linear_op``, ``multilinear_op``, ``nonlinear_op``."""

    fixed: int
    vectorized: bool


# The options both APIs accept under the same name, besides name and replace (which
# name the binding, and are not part of `Options`) and fixed / vectorized.
OPTION_NAMES = (
    "platform_mode",
    "input_output_aliases",
    "has_side_effect",
    "ordered",
    "linear_in",
    "state",
    "sharding",
    "reduction",
    "prefer_reference",
)

# Appended to the docstrings of get_linear_call and get_nonlinear_call; the decorators
# of the pytree API refer to it.
OPTION_DOCS = """
    Options (keyword arguments of both APIs):

    - ``first_n_args_fixed`` (``fixed`` in the decorators): the number of leading
      arguments that are parameters, not inputs; they are not differentiated,
      transposed or vectorized.
    - ``func_can_batch`` (``vectorized`` in the decorators): the callables handle
      batched inputs themselves (see "Batching"); otherwise jaxbind loops.
    - ``name``: the binding's name, as jaxprs, HLO and exported programs show it,
      and by which compiled and exported programs find the binding; defaults to the
      module and qualified name of ``f``.
    - ``replace``: let this binding take over an explicit ``name`` that a different
      binding has (otherwise an error). Not needed to run a notebook cell or a
      module again: a function defined again at the same place replaces its
      earlier binding.
    - ``platform_mode``: how GPU programs call the callables. ``"device"`` (default):
      with zero-copy CUDA arrays of the device buffers (``CudaArray``: CUDA array
      interface and DLPack) and XLA's stream (``jaxbind.current_call()``).
      ``"host"``: with NumPy copies on the host, for CPU-only libraries; the
      outputs are copied back. On the CPU both modes pass NumPy views.
    - ``input_output_aliases``: ``{input index: output index}``: the output shares the
      input's memory (as ``ffi_call``'s argument), so the callable updates it in
      place: ``out[k]`` holds the input's values when the callable starts. With
      the input donated (``jax.jit(..., donate_argnums=...)``) nothing is copied;
      otherwise XLA copies the input first. Shapes and dtypes must match. Applies
      to ``f``; derivatives and transposes get fresh outputs.
    - ``has_side_effect``: the callables do something besides writing their outputs;
      calls are never removed as dead code nor merged with identical calls
      (see "Side effects" in the README).
    - ``ordered``: also keep program order among ordered jaxbind calls (and
      ``io_callback(ordered=True)``), through ``jit``, ``scan``, ``while_loop``
      and ``cond``; implies ``has_side_effect``.
    - ``linear_in`` (nonlinear ops): indices of arguments in which ``f`` is linear,
      jointly, when the others are held fixed (a NUFFT is linear in its values, not
      in its points). ``jax.linear_transpose`` (and a transpose inside any program)
      with respect to these arguments, the others known, then works: jaxbind
      computes it with the VJP at zero values, whose cotangents for these arguments
      are the transpose.
    - ``state``: an object the callables use at every call, set up once per call site
      when XLA instantiates it (a plan, a handle), made with ``@jaxbind.state``. Callables
      of ``get_*_call`` reach it with ``jaxbind.load_state(kwargs_dump)``; the bodies of
      the decorators get it as their ``state`` argument. See docs/state.md.
    - ``sharding``: how XLA may split a call across devices when the program is
      partitioned automatically (``jax.jit`` over sharded arrays), in the einsum-like
      notation of Shardy and ``custom_partitioning``: one group of factor names per
      argument (fixed ones included; pytree leaves in order in the decorators), then
      ``->`` and one per result, e.g. ``"m d, m -> g"``. A factor in arguments and
      results is split as the arguments are (each device computes its own part); a
      factor named in ``reduction`` (arguments only) may be split too, and the partial
      results of the devices are summed by one all-reduce; every other factor stays
      whole on each device (give an axis that must not be split different names on the
      two sides: ``"n -> k"``). Derivatives and transposes get the rule that follows.
      Where the rule depends on the call (a NUFFT's type, its grid's rank), give a
      function of the shapes of f's arguments (one positional argument each) and the call's
      keyword arguments that returns the rule, or the tuple
      ``(rule, reduction)``: it is called at every call, for every role.
      Without it (or on one device, or inside ``shard_map``) calls lower as before.
      See docs/sharding.md.
    - ``reduction``: the factors of ``sharding`` that ``f`` sums over: ``f`` of all the
      arguments is the sum of ``f`` of their parts along these factors.
    - ``reference`` (a keyword of its own, or ``op.def_reference`` in the decorators): the
      op's JAX reference, a function of JAX arrays that computes what ``f`` computes:
      called with f's arguments (fixed ones included; pytrees in the decorators) and the
      call's keyword arguments, it returns f's outputs (an array, or a tuple/list of
      them; the pytree ``shape`` describes in the decorators). Programs lowered for a
      platform without a native body (TPU, ROCm, a PJRT plugin) compute the op by it;
      ``jaxbind.export(..., portable=True)`` and ``jaxbind.use_reference()`` use it
      everywhere; a derivative or transpose the op was given no body for is derived
      from it by JAX; ``jaxbind.testing.check`` compares the native op with it. See
      docs/portable.md.
      ``reference`` may also be a ``jaxbind.Reference(function, tolerance=...,
      platforms=...)``: the function with how far an approximate native body may be from
      it (for ``jaxbind.testing.check``) and where it is preferred.
    - ``prefer_reference``: platforms (``"cpu"``, ``"cuda"``) where the reference computes
      the op although its native body could run there, e.g. ``("cuda",)`` for a CPU
      library that would run in host mode in GPU programs: the reference's ``platforms``,
      given as an option (an op given both with different platforms is an error).
"""


def declare(
    what: str,
    kind: str,
    given: Mapping[str, Any],
    *,
    pytree_api: bool,
    default_name: str | None = None,
) -> tuple[Options, str | None, bool, tuple[str, ...]]:
    """Check the options that `what` (the API function or decorator) was given for an op
    of `kind` ("linear", "multilinear", "nonlinear"), and return them as one value, with
    the binding's explicit name (or None), ``replace`` and ``prefer_reference`` (the
    platforms, for the op's `Reference`). `pytree_api`: the caller is the
    pytree API, which names two options differently. `default_name`: the name the op
    gets without ``name=``, where it is known already, for messages."""
    fixed_name, vectorized_name = (
        ("fixed", "vectorized") if pytree_api else ("first_n_args_fixed", "func_can_batch")
    )
    options = dict(given)
    name = options.pop("name", None)
    replace = options.pop("replace", False)
    fixed = options.pop(fixed_name, 0)
    vectorized = options.pop(vectorized_name, False)
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"jaxbind.{what}: unknown option {unknown[0]!r}; the options are name, replace, "
            f"{fixed_name}, {vectorized_name}, {', '.join(OPTION_NAMES)}"
        )
    fixed = _count(fixed, fixed_name, pytree_api)
    platform_mode = options.get("platform_mode", "device")
    if platform_mode not in PLATFORM_MODES:
        raise ValueError(
            f"jaxbind: platform_mode must be one of {PLATFORM_MODES}, got {platform_mode!r}"
        )
    linear_in = options.get("linear_in", ())
    if linear_in and kind != "nonlinear":
        raise TypeError(
            "jaxbind: linear_in is an option of nonlinear ops; linear and multilinear ops "
            "are linear in all their arguments after the fixed ones already"
        )
    if not isinstance(replace, bool):
        raise TypeError(f"jaxbind.{what}: replace must be a bool, got {replace!r}")
    checked = Options(
        fixed=fixed,
        vectorized=bool(vectorized),
        platform_mode=platform_mode,
        aliases=_aliases(options.get("input_output_aliases"), fixed, fixed_name),
        effect=_effect(options.get("has_side_effect", False), options.get("ordered", False)),
        linear_in=_linear_in(linear_in, fixed, fixed_name),
        pytree_api=pytree_api,
        state=_state(what, options.get("state"), pytree_api),
        sharding=_sharding(
            what,
            name or default_name,
            options.get("sharding"),
            _reduction(
                what, name or default_name, options.get("sharding"), options.get("reduction", ())
            ),
        ),
    )
    return checked, name, replace, _prefer_reference(what, name or default_name, options)


def _prefer_reference(what: str, name: str | None, options: Mapping[str, Any]) -> tuple[str, ...]:
    value = options.get("prefer_reference", ())
    platforms = native_platforms(value)
    if platforms is None:
        native = " and ".join(f'"{p}"' for p in NATIVE_PLATFORMS)  # (the table of body kinds)
        raise ValueError(
            f"{_op(what, name)}: prefer_reference must be a sequence of the platforms where "
            f"the op has a native body, {native} (elsewhere its reference runs "
            f"anyway), got {value!r}"
        )
    if platforms and (options.get("has_side_effect") or options.get("ordered")):
        raise TypeError(
            f"{_op(what, name)}: prefer_reference with side effects (has_side_effect/"
            "ordered): a JAX reference computes outputs, not effects"
        )
    return platforms


def _count(value: Any, fixed_name: str, pytree_api: bool) -> int:
    """The number of fixed arguments, however JAXbind 1.3's users spelled it: an int, a
    NumPy integer, a bool or an integral float (1.3 never read the value before a
    derivative, so any of these ran), or None (none fixed)."""
    if value is None:
        return 0
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    try:
        count = operator.index(value)
    except TypeError:
        count = None
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            count = int(value)
    if count is None or count < 0:
        history = (
            ""
            if pytree_api
            else "; JAXbind 1.3 took any value here, but every derivative of such an op "
            "failed (it never read the value before a derivative)"
        )
        raise TypeError(
            f"jaxbind: {fixed_name} must be a non-negative integer (the number of leading "
            f"fixed arguments), got {value!r}{history}"
        )
    return count


def _aliases(value: object, fixed: int, fixed_name: str) -> tuple[tuple[int, int], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(
        type(k) is int and type(v) is int and k >= 0 and v >= 0 for k, v in value.items()
    ):
        raise TypeError(
            "jaxbind: input_output_aliases must be a dict {input index: output "
            f"index}} of non-negative ints, got {value!r}"
        )
    if len(set(value.values())) != len(value):
        raise ValueError(
            f"jaxbind: input_output_aliases {value!r} aliases one output with several inputs"
        )
    fixed_inputs = [k for k in value if k < fixed]
    if fixed_inputs:
        raise ValueError(
            f"jaxbind: input_output_aliases: input {fixed_inputs[0]} is fixed "
            f"({fixed_name}={fixed}); only inputs after the fixed ones can "
            "share memory with an output"
        )
    return tuple(sorted(value.items()))


def _effect(has_side_effect: object, ordered: object) -> str | None:
    if not isinstance(has_side_effect, bool) or not isinstance(ordered, bool):
        raise TypeError("jaxbind: has_side_effect and ordered must be bools")
    if ordered:
        return "ordered"
    return "unordered" if has_side_effect else None


def _linear_in(linear_in: Any, fixed: int, fixed_name: str) -> tuple[int, ...]:
    try:
        ok = all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in linear_in)
    except TypeError:  # not iterable
        ok = False
    if not ok:
        raise TypeError(
            f"jaxbind: linear_in must be a sequence of argument indices, got {linear_in!r}"
        )
    args = tuple(sorted(set(linear_in)))
    if any(i < fixed for i in args):
        raise ValueError(
            f"jaxbind: linear_in {args} names fixed arguments ({fixed_name}="
            f"{fixed}); only differentiable arguments can be linear"
        )
    return args


def _state(what: str, value: Any, pytree_api: bool) -> Any:
    if value is None:
        return None
    # (a StateDef, or a C state's: jaxbind.c_state)
    if "StateDef" not in {c.__name__ for c in type(value).__mro__} or not hasattr(value, "setup"):
        raise TypeError(
            f"jaxbind.{what}: state must be declared with @jaxbind.state (def setup(*, ...): "
            f"return the object), got {value!r}"
        )
    return value


def _op(what: str, name: str | None) -> str:
    return f"jaxbind.{what}" + (f" ('{name}')" if name else "")


def _sharding(
    what: str, name: str | None, value: Any, reduction: tuple[str, ...]
) -> Sharding | None:
    """The declared rule as a value: a text parsed here (its fit to the op's roles is
    checked with the op's functions, by _rules.partitioning.check_declaration), or the
    function that gives it per call (checked at every call)."""
    if value is None:
        return None
    if not callable(value) and (not isinstance(value, str) or "->" not in value):
        raise TypeError(
            f"{_op(what, name)}: sharding must be a string in einsum-like notation, one group "
            'of factor names per argument, "->", one per result (e.g. sharding="m d, m -> g"), '
            "or a function of the shapes of f's arguments and the call's keyword arguments "
            f"that returns one; got {value!r}"
        )
    try:
        return Sharding.declare(value, reduction)
    except RuleError as exc:
        given = f"sharding={' '.join(value.split())!r}" + (
            f", reduction={reduction!r}" if reduction else ""
        )
        raise ValueError(f"{_op(what, name)}: {given}: {exc}") from None


def _reduction(what: str, name: str | None, sharding: Any, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    try:
        factors = tuple(value)
    except TypeError:
        factors = None
    if factors is None or not all(isinstance(f, str) for f in factors):
        raise TypeError(
            f"{_op(what, name)}: reduction must be a sequence of factor names of sharding= "
            f'(e.g. reduction=("m",)), got {value!r}'
        )
    if factors and callable(sharding):
        raise TypeError(
            f"{_op(what, name)}: reduction={factors!r} with a sharding= function: return the "
            "reduction factors from the function with the rule, as (rule, reduction)"
        )
    if factors and sharding is None:
        raise TypeError(
            f"{_op(what, name)}: reduction={factors!r} names factors of a sharding rule, but "
            'the op declares none; add sharding= (e.g. sharding="m d, m -> g")'
        )
    return tuple(dict.fromkeys(factors))


def state_key_positions(options: Options, fn: Any, op: str, source: str) -> Options:
    """`options` with the positions of its state's key inputs: the names in ``key=`` are
    positional parameters of `fn`, which names the op's arguments in order (the op's
    function in the pytree API, its abstract function in the other: `source` says
    which, for the message). Which roles receive them is checked with the role table
    (jaxbind._api.check_state_key)."""
    sdef = options.state
    if sdef is None or not sdef.key:
        return options
    try:
        names = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        names = []
    positions = []
    for k in sdef.key:
        if k not in names:
            raise ValueError(
                f"jaxbind: '{op}': its state {sdef.name!r} has key={sdef.key}, and {k!r} is "
                f"not one of the op's arguments as {source} names them {tuple(names)}; name "
                f"in key= the parameters of {source} (its positional parameters, in order) "
                "that the object depends on"
            )
        positions.append(names.index(k))
    if options.vectorized and any(p >= options.fixed for p in positions):
        fixed, vectorized = (
            ("fixed", "vectorized")
            if options.pytree_api
            else ("first_n_args_fixed", "func_can_batch")
        )
        k = sdef.key[next(i for i, p in enumerate(positions) if p >= options.fixed)]
        raise ValueError(
            f"jaxbind: '{op}': its state's key input {k!r} is not a fixed argument, and the "
            f"op is vectorized ({vectorized}=True): under vmap every input after the fixed "
            f"ones arrives batched, and one setup would get the whole batch of values. Make "
            f"{k!r} a fixed argument ({fixed}=), or drop {vectorized}=True (jaxbind's batch "
            "loop gives the setup one element at a time)"
        )
    return dataclasses.replace(options, state_key=tuple(positions))
