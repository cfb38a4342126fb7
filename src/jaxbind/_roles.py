"""Roles: an op's function and its derivatives, each one entry of the binding's role table.

  linear       "f"  <-> "T"                    (f_T: the transpose)
  multilinear  "f";  "T<i>": the transpose with respect to argument i
  nonlinear    "f";  "jvp" <-> "vjp"           (f is transposed through its VJP
                                                 only where it is declared linear_in)

Each role is one `RoleDef`: its body (what computes it), its abstract
function (the shapes of its outputs), its argument layout (`Args`) and its
transpose partner. `role_table` builds the table from what either API was
given; the rules read it and never ask which API made the op.

A body is one of the `Body` kinds, a table with a row per kind: a Python callable, which
the trampoline calls while the program runs; a compiled kernel, which it calls without
the GIL; a CUDA kernel, which it launches on a GPU; a JAX function, which is traced into
the program; or the role derived from the op's reference, traced as well. What runs a
call on a platform is asked of _where.runs; the rules for each kind are grouped in
``jaxbind._rules`` (one set per kind).

Roles travel as text (in the CallSpec and in a program's ``role`` attribute) and are
parsed once into a `Role`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ANYWHERE",
    "Args",
    "Body",
    "JaxFunction",
    "Kind",
    "NATIVE_PLATFORMS",
    "OpBase",
    "Reference",
    "ReferenceRole",
    "Role",
    "RoleDef",
    "describe_role",
    "for_call",
    "native_platforms",
    "is_jax_function",
    "jax_function",
    "role_table",
    "same_values",
    "XLA_PLATFORMS",
]


class Kind(enum.Enum):
    """How an op depends on its arguments after the fixed ones."""

    LINEAR = "linear"
    MULTILINEAR = "multilinear"
    NONLINEAR = "nonlinear"


@dataclass(frozen=True, slots=True)
class Role:
    """One role's name: "f", "T", "jvp", "vjp", or "T<i>" (multilinear).

    Attributes:
      text: the role as programs and CallSpecs carry it.
      base: "f", "T", "jvp" or "vjp".
      index: i for the multilinear transpose "T<i>", else None.
    """

    text: str
    base: str
    index: int | None = None

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def parse(text: str) -> Role:
        """The role named by `text`; LookupError for anything else (it may come from a file)."""
        if text in ("f", "T", "jvp", "vjp"):
            return Role(text, text)
        digits = text[1:]
        if (
            text[:1] == "T"
            and digits.isascii()
            and digits.isdigit()
            and len(digits) <= 6
            and digits == str(int(digits))
        ):
            return Role(text, "T", int(digits))
        raise LookupError(f"there is no role {text!r}")

    def describe(self) -> str:
        if self.base == "f":
            return "the function"
        if self.index is not None:
            return f"the transpose with respect to argument {self.index}"
        if self.base == "T":
            return "the transpose"
        return f"the {self.base.upper()}"


def describe_role(role: str) -> str:
    """Words for a role, for messages ("the transpose", "the JVP", ...)."""
    try:
        return Role.parse(role).describe()
    except LookupError:
        return f"role {role!r}"


def same_values(a, b) -> bool:
    """Whether two registrations hold the same things: the same callables (a bound
    method: the same function on the same object), equal plain values. A user's
    ``__eq__`` decides only where it answers with a bool: a dataclass holding an
    array compares elementwise, which says neither."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, types.MethodType):
        return a.__self__ is b.__self__ and a.__func__ is b.__func__
    if isinstance(a, functools.partial):
        return (
            same_values(a.func, b.func)
            and same_values(a.args, b.args)
            and same_values(a.keywords, b.keywords)
        )
    try:
        equal = a == b
    except Exception:
        return False
    return equal if isinstance(equal, bool) else False


# --- bodies ----------------------------------------------------------------------------


# The platforms of a body traced into the program (Body.platforms): any the program has
ANYWHERE = ("any",)


class OpBase:
    """What every jaxbind op is (the Op class of _api derives from it). An op is a JAX
    function, so it can be the body of another op's derivative."""

    __slots__ = ()


class JaxFunction:
    """A derivative given as a JAX function rather than a callable (see jax_function).

    It is called with JAX arrays, ``fn(*primals, *tangents_or_cotangents, **kwargs)``,
    returns a sequence of arrays, and is traced into the program, so JAX can
    differentiate, batch and lower it like any JAX code.
    """

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"jaxbind.jax_function: expected a callable, got {fn!r}")
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __eq__(self, other):
        return isinstance(other, JaxFunction) and same_values(other.fn, self.fn)

    def __hash__(self):
        try:
            return hash(self.fn)
        except TypeError:  # e.g. a dataclass with eq=True: equal ones share their type
            return hash(type(self.fn))

    def __repr__(self):
        return f"jax_function({self.fn!r})"


class ReferenceRole(JaxFunction):
    """A role of an op computed from the op's JAX reference (``reference=``): the role
    table's reference column, and the body of a role the op declares no rule for (a
    derived rule). ``value`` is the op's `Reference` (f's, for every role), ``fn`` its
    function; _rules.reference makes the role's function from it (f itself, JAX's JVP or
    VJP of it, its transpose)."""

    __slots__ = ("role", "value")

    def __init__(self, value: Reference, role: Role):
        super().__init__(value.function)
        self.value = value
        self.role = role

    def __eq__(self, other):
        return (
            isinstance(other, ReferenceRole)
            and other.role == self.role
            and other.value == self.value
        )

    def __hash__(self):
        return hash((self.role.text, super().__hash__()))

    def __repr__(self):
        return f"reference({self.fn!r}, {self.role.text!r})"


def jax_function(fn: Callable) -> JaxFunction:
    """Mark `fn` as a JAX function, for use as ``f_jvp`` or ``f_vjp`` of a nonlinear op.

    ``fn(*primals, *tangents, **kwargs)`` (JVP) or ``fn(*primals, *cotangents,
    **kwargs)`` (VJP) takes JAX arrays and returns a sequence of arrays instead
    of writing into ``out``. jaxbind traces it into the program, so its own
    derivatives come from JAX: built from jax.numpy or from other jaxbind ops, it
    makes the nonlinear op differentiable to second order (Hessians) and beyond,
    as far as the ops inside it are. A jaxbind op can be passed directly.
    """
    return fn if isinstance(fn, JaxFunction) else JaxFunction(fn)


def is_jax_function(fn) -> bool:
    """A body that is traced into the program: a jax_function or a jaxbind op."""
    return isinstance(fn, (JaxFunction, OpBase))


class Body(enum.Enum):
    """The kinds of body, one table as the lowering's targets are one (_rules.targets):
    what computes a role, and so which set of rules applies to its calls
    (_rules.BODY_RULES) and what runs a call of it on each platform (_where.runs, the one
    function that reads the platforms).

    Columns:
      platforms: where it runs itself, as JAX's lowering names platforms (`ANYWHERE`: it is
        traced into the program, so it runs wherever the program does);
      calls: the target table's ``calls`` column of its custom call ("": none, traced);
      traced: JAX sees its computation (and so differentiates, batches and partitions it);
      compiled: compiled code the trampoline runs without the GIL (see _kernels: a
        kernel's class declares its kind, ``body_kind``).
    """

    # fmt: off
    #                    value                platforms        calls     traced compiled
    CALLABLE          = ("callable",          ("cpu", "cuda"), "plain",  False, False)
    KERNEL            = ("kernel",            ("cpu",),        "plain",  False, True)  # .kernel
    STREAM_KERNEL     = ("stream_kernel",     ("cuda",),       "plain",  False, True)  # (a)
    GRAPH_SAFE_KERNEL = ("graph_safe_kernel", ("cuda",),       "kernel", False, True)  # (b)
    CUDA_KERNEL       = ("cuda_kernel",       ("cuda",),       "kernel", False, True)  # (c)
    JAX               = ("jax",               ANYWHERE,        "",       True,  False)  # (d)
    DERIVED           = ("derived",           ANYWHERE,        "",       True,  False)  # (e)
    # fmt: on
    # (a) jaxbind.kernel(..., platform="cuda"): a compiled host function called with XLA's
    #     stream and the device, which enqueues the work (a CUDA library's entry point)
    # (b) the same with graph_safe=True: its handler may be captured into CUDA graphs
    # (c) jaxbind.cuda_kernel: PTX or a cubin, launched by the trampoline
    # (d) jaxbind.jax_function, or a jaxbind op; (e) a role derived from the reference

    platforms: tuple[str, ...]
    calls: str
    traced: bool
    compiled: bool

    def __new__(cls, value: str, platforms: tuple, calls: str, traced: bool, compiled: bool):
        kind = object.__new__(cls)
        kind._value_ = value
        kind.platforms, kind.calls, kind.traced, kind.compiled = platforms, calls, traced, compiled
        return kind

    @staticmethod
    def of(fn) -> Body:
        """The kind of `fn`: a body that is not a Python callable says so (a compiled
        kernel's class has ``body_kind``, see _kernels)."""
        declared = getattr(type(fn), "body_kind", None)
        if isinstance(declared, Body):
            return declared
        if isinstance(fn, ReferenceRole):
            return Body.DERIVED
        return Body.JAX if is_jax_function(fn) else Body.CALLABLE


# The platforms where some kind of body runs itself (every other platform runs traced
# bodies and references only), and the names XLA registers targets under on each
NATIVE_PLATFORMS = tuple(dict.fromkeys(p for k in Body if not k.traced for p in k.platforms))
XLA_PLATFORMS = {"cpu": "cpu", "cuda": "CUDA"}


def native_platforms(value) -> tuple[str, ...] | None:
    """`value` (a platform's name, or a sequence of them) as sorted distinct platforms
    where some body runs itself (`NATIVE_PLATFORMS`), or None if it is not that."""
    if isinstance(value, str):
        value = (value,)
    try:
        platforms = tuple(value)
    except TypeError:
        return None
    if not all(isinstance(p, str) and p in NATIVE_PLATFORMS for p in platforms):
        return None
    return tuple(sorted(set(platforms)))


class Reference:
    """An op's JAX reference, one value: its function, how far the native body may be
    from it, and where it computes the op although the native body could.

    ``jaxbind.Reference(function, *, tolerance=None, platforms=())``, given as
    ``reference=`` in both APIs or to ``@op.def_reference`` (a plain function is the
    value with neither), is what the op keeps: the role table's reference column
    (`ReferenceRole`), which the lowering (_where.runs) and jaxbind.testing.check read.

    Attributes:
      function: ``function(*args, **kwargs)`` with the op's arrays as JAX arrays and the
        call's keyword arguments, returning the op's outputs (see docs/portable.md).
      tolerance: for a native body that computes approximately (a NUFFT at an
        ``epsilon``): the relative error allowed against the reference, a number or a
        function of the call's keyword arguments returning one; None: the body is exact
        (only rounding is allowed). A function's ``tolerance`` attribute, the older
        spelling, is read once into it.
      platforms: where the reference computes the op although the native body could run
        ("cpu", "cuda"; e.g. ``("cuda",)`` for a CPU library that would run in host mode
        in GPU programs); ``prefer_reference=`` is the same statement as an option.
    """

    __slots__ = ("function", "tolerance", "platforms")

    function: Callable
    tolerance: float | Callable[..., float] | None
    platforms: tuple[str, ...]

    def __init__(self, function: Callable, *, tolerance=None, platforms=()):
        if isinstance(function, Reference):
            raise TypeError(
                f"jaxbind.Reference: function is a Reference already ({function!r}); give "
                "its function, or the Reference itself as reference="
            )
        if not callable(function):
            raise TypeError(
                "jaxbind.Reference: function must be a JAX function of the op's arrays and "
                f"keyword arguments that returns its outputs, got {function!r}"
            )
        if tolerance is None:
            tolerance = getattr(function, "tolerance", None)
        if not (
            tolerance is None
            or callable(tolerance)
            or (
                isinstance(tolerance, (int, float))
                and not isinstance(tolerance, bool)
                and tolerance >= 0
            )
        ):
            raise TypeError(
                "jaxbind.Reference: tolerance must be a non-negative number, or a function "
                f"of the call's keyword arguments that returns one; got {tolerance!r}"
            )
        checked = native_platforms(platforms)
        if checked is None:
            raise ValueError(
                "jaxbind.Reference: platforms must be a sequence of the platforms where the "
                f"op has a native body, {' and '.join(map(repr, NATIVE_PLATFORMS))} "
                f"(elsewhere its reference runs anyway), got {platforms!r}"
            )
        object.__setattr__(self, "function", function)
        object.__setattr__(self, "tolerance", tolerance)
        object.__setattr__(self, "platforms", checked)

    def __setattr__(self, name, value):
        raise AttributeError(f"jaxbind.Reference is frozen: {name} cannot be set")

    def __call__(self, *args, **kwargs):
        """The function itself (a Reference computes what its function does)."""
        return self.function(*args, **kwargs)

    def tolerance_for(self, kwargs: dict) -> float | None:
        """The relative error allowed for a call with keyword arguments `kwargs` (None:
        only rounding)."""
        if callable(self.tolerance):
            return float(self.tolerance(**kwargs))
        return None if self.tolerance is None else float(self.tolerance)

    def replace(self, **changes) -> Reference:
        """This value with `changes` (function, tolerance, platforms)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(changes)
        return Reference(fields.pop("function"), **fields)

    def __eq__(self, other):
        return (
            isinstance(other, Reference)
            and same_values(other.function, self.function)
            and same_values(other.tolerance, self.tolerance)
            and other.platforms == self.platforms
        )

    def __hash__(self):
        try:
            return hash((self.function, self.platforms))
        except TypeError:
            return hash((type(self.function), self.platforms))

    def __reduce__(self):
        return (_reference, (self.function, self.tolerance, self.platforms))

    def __repr__(self):
        extra = "".join(
            f", {name}={getattr(self, name)!r}"
            for name, empty in (("tolerance", None), ("platforms", ()))
            if getattr(self, name) != empty
        )
        return f"jaxbind.Reference({self.function!r}{extra})"


def _reference(function, tolerance, platforms) -> Reference:  # (pickles)
    return Reference(function, tolerance=tolerance, platforms=platforms)


# --- argument layouts --------------------------------------------------------------------


class Args(enum.Enum):
    """Which arguments a role takes, in order, and what its outputs are.

    The number of leading arguments that a call of the role is not linear in (its
    ``n_fixed``) is part of each call (CallSpec.n_fixed): the op's fixed arguments
    for "f" and "T", all primals for "jvp" and "vjp".
    """

    F = ("the fixed arguments, then the inputs", "the outputs")
    T = ("the fixed arguments, then cotangents of the outputs", "cotangents of the inputs")
    T_I = (
        "the other arguments of f, then cotangents of its outputs",
        "the cotangent of argument i",
    )
    JVP = ("all primals, then tangents of the inputs after the fixed ones", "output tangents")
    VJP = ("all primals, then cotangents of the outputs", "cotangents of the inputs")

    @property
    def shaped_like_f(self) -> bool:
        """The outputs are shaped as f's at the primals (the JVP's tangents)."""
        return self is Args.JVP

    def position(self, p: int, fixed: int, index: int | None = None) -> int | None:
        """Where argument `p` of f (an op with `fixed` fixed arguments) is among this
        layout's arguments, or None if the role does not receive it; `index`: i of the
        multilinear transpose "T<i>"."""
        if self is Args.T:  # the fixed arguments, then cotangents
            return p if p < fixed else None
        if self is Args.T_I:  # f's arguments but the i-th, then cotangents
            assert index is not None
            return p if p < index else (None if p == index else p - 1)
        return p  # f, JVP, VJP: every argument of f first, in order


@dataclass(frozen=True, slots=True, eq=False)
class RoleDef:
    """One role of a binding.

    Attributes:
      role: its name.
      body: the callable or JAX function that computes it; None if the op was given none.
      abstract: the output shapes from the arguments' (f's, at the primals, for the
        JVP); None: the outputs are shaped as the primal inputs they are (co)tangents
        of, which the transpose rule knows (CallSpec.out_hint).
      args: which arguments it takes.
      partner: the role that transposes it, for roles linear jointly in all their
        arguments after the leading ones; None for the others (a nonlinear f goes to
        its VJP where it is linear_in; a multilinear role's partner depends on the
        argument).
      reference: the role computed from the op's JAX reference, or None (the op has
        none); a role given no body has it as its body (`derived`).
    """

    role: Role
    body: Callable | None
    abstract: Callable | None
    args: Args
    partner: str | None
    reference: ReferenceRole | None = None

    @property
    def kind(self) -> Body:
        return Body.of(self.body)

    @property
    def derived(self) -> bool:
        """Whether the op declared no body for the role, which its reference computes."""
        return isinstance(self.body, ReferenceRole)

    @property
    def jointly_linear(self) -> bool:
        """Linear jointly in all its arguments after the leading n_fixed ones."""
        return self.partner is not None

    def declared(self, avals, kwargs: dict, n_fixed: int, trees=None):
        """What the abstract function returns for a call of the role with arguments
        `avals` (``kwargs`` hold ``batch_axes`` for ops that are vectorized): for the
        JVP, f's abstract function at the primals, its first `n_fixed` arguments.
        `trees`: the call's pytree structure (see for_call)."""
        assert self.abstract is not None  # roles without one: see declared_outputs
        avals, kwargs = self.abstract_arguments(avals, kwargs, n_fixed)
        return for_call(self.abstract, trees)(*avals, **kwargs)

    def abstract_arguments(self, avals, kwargs: dict, n_fixed: int) -> tuple[tuple, dict]:
        """The arguments with which `declared` calls the abstract function."""
        if self.args.shaped_like_f:
            avals = avals[:n_fixed]
            if isinstance(kwargs.get("batch_axes"), tuple):
                kwargs = {**kwargs, "batch_axes": kwargs["batch_axes"][:n_fixed]}
        return tuple(avals), kwargs

    def positions(self, args: tuple[int, ...], fixed: int) -> tuple[int | None, ...]:
        """Where f's arguments `args` are among this role's (None: not received)."""
        return tuple(self.args.position(p, fixed, self.role.index) for p in args)

    def identity(self) -> tuple:
        """What makes two definitions of the role the same (see same_values)."""
        return (self.role.text, self.body, self.abstract, self.reference)


def role_table(
    kind: Kind, f, transposes, derivatives, abstract, abstract_T, reference: Reference | None = None
) -> dict:
    """The roles of an op made from what either API was given, by role name.

    `transposes` is f_T (linear) or one transpose per argument (multilinear, None
    where there is none); `derivatives` is (f_jvp, f_vjp) for a nonlinear op;
    `abstract_T` gives the transposes' (or the VJP's) output shapes, or None where
    they come from the primals. `reference`: the op's JAX reference, or None; with one,
    every role has its reference column, and a role given no body is derived from it.
    """
    p = Role.parse
    table = {}
    if kind is Kind.LINEAR:
        table["f"] = RoleDef(p("f"), f, abstract, Args.F, "T")
        table["T"] = RoleDef(p("T"), transposes, abstract_T, Args.T, "f")
    elif kind is Kind.MULTILINEAR:
        table["f"] = RoleDef(p("f"), f, abstract, Args.F, None)
        shapes = abstract_T or (None,) * len(transposes)
        for i, (fn, shape) in enumerate(zip(transposes, shapes)):
            table[f"T{i}"] = RoleDef(p(f"T{i}"), fn, shape, Args.T_I, None)
    else:
        f_jvp, f_vjp = derivatives
        table["f"] = RoleDef(p("f"), f, abstract, Args.F, None)
        table["jvp"] = RoleDef(p("jvp"), f_jvp, abstract, Args.JVP, "vjp")
        table["vjp"] = RoleDef(p("vjp"), f_vjp, abstract_T, Args.VJP, "jvp")
    if reference is not None:
        table = {name: with_reference(entry, reference) for name, entry in table.items()}
    return table


def with_reference(entry: RoleDef, reference: Reference) -> RoleDef:
    """`entry` with its reference column, and derived from it if it has no body."""
    ref = ReferenceRole(reference, entry.role)
    body = ref if entry.body is None and entry.role.base != "f" else entry.body
    return dataclasses.replace(entry, body=body, reference=ref)


def for_call(fn: Callable, trees, kwargs_dump=None) -> Callable:
    """`fn` (a body or an abstract function) as it runs a call whose pytree structure is
    `trees` (see CallSpec.trees; None for calls without one): the pytree API's
    functions take the structure through their ``for_trees`` method. A call site's body
    given the site's keyword arguments (`kwargs_dump`, which every call of the site gets)
    takes both through ``for_site`` where it has one."""
    if trees is None:
        return fn
    target = fn.fn if isinstance(fn, JaxFunction) else fn
    for_site = getattr(target, "for_site", None) if kwargs_dump is not None else None
    if for_site is not None:
        return for_site(trees, kwargs_dump)
    bind = getattr(target, "for_trees", None)
    if bind is None:
        raise TypeError(f"jaxbind: {fn!r} takes no pytree structure, but the call has one")
    return bind(trees)


def missing_role(role: Role, reference: Reference | None = None) -> RoleDef:
    """The entry of a multilinear transpose beyond those given (no body; derived from the
    op's `reference` if it has one)."""
    entry = RoleDef(role, None, None, Args.T_I, None)
    return entry if reference is None else with_reference(entry, reference)
