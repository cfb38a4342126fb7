"""Bindings: the user's callables for one op, their roles, and the name registry.

A binding holds everything an op was defined with: its role table (see _roles:
each role's body, abstract function, argument layout and transpose partner) and
its Options (see _options).

Bindings are registered by name so that a compiled program, which names its
binding by string, can find the callable again (see _runtime.sites). Who owns a
binding's call sites is _sites' (`Binding.sites`).
"""

from __future__ import annotations

import functools
import heapq
import threading
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from ._errors import about, words
from ._options import Options
from ._roles import Kind, OpBase, Reference, Role, RoleDef, missing_role, same_values
from ._sites import Sites

__all__ = ["Binding", "register", "lookup"]

# What needs each role's body, for the message when an op was given none.
_NEEDED_FOR = {
    "f": "all calls",
    "T": "grad, vjp and jax.linear_transpose",
    "jvp": "jax.jvp and jax.linearize (forward mode)",
    "vjp": "grad and vjp (reverse mode)",
}


@dataclass(eq=False)
class Binding:
    """The callables and settings of one jaxbind op."""

    name: str
    kind: Kind
    roles: dict[str, RoleDef]  # by role name, see _roles.role_table
    # fixed arguments, vectorized batching, GPU mode, aliases, effects, linear_in (_options)
    options: Options
    # the owners of its call sites (programs' holders, executables, orphans: _sites)
    sites: Sites = field(default_factory=Sites, repr=False, compare=False)
    # whether the name is the callable's qualified name (set when registered)
    default_name: bool = field(default=True, repr=False, compare=False)
    # (roles, the identity of their inlined code): _definition.inlined's, once per role table
    inlined_cache: tuple | None = field(default=None, init=False, repr=False, compare=False)
    __weakref__: object = field(default=None, init=False, repr=False, compare=False)

    def callables(self) -> tuple:
        """Everything user-supplied, to tell equal bindings from clashing ones."""
        return (self.kind, tuple(r.identity() for r in self.roles.values()), self.options)

    @property
    def reference(self) -> Reference | None:
        """The op's JAX reference (f's; every role's reference column derives from it):
        its function, tolerance and preferred platforms (_roles.Reference)."""
        ref = self.roles["f"].reference
        return None if ref is None else ref.value

    @property
    def f(self) -> Callable:
        """The body of the function itself (role "f")."""
        return self.body("f")

    def role(self, role: str | Role) -> RoleDef:
        """The entry of the role table for `role`; LookupError if the op has no such role."""
        role = Role.parse(role) if isinstance(role, str) else role
        found = self.roles.get(role.text)
        if found is not None:
            return found
        if self.kind is Kind.MULTILINEAR and role.index is not None:
            # a transpose beyond those given: none given (derived, with a reference)
            return missing_role(role, self.reference)
        raise LookupError(
            f"jaxbind: binding '{self.name}' ({self.kind.value}) has no role {role.text!r}"
        )

    def body(self, role: str | Role) -> Callable:
        """The body of `role`; NotImplementedError, naming the op, if it was given none."""
        entry = self.role(role)
        if entry.body is None:
            raise NotImplementedError(
                f"{about(self.name)} has no {entry.role.describe().removeprefix('the ')}, "
                f"which {_NEEDED_FOR[entry.role.base]} need; "
                f"{words(self.options).give(entry.role)}"
            )
        return entry.body

    def has(self, role: str) -> bool:
        """Whether the op was given a body for `role`."""
        entry = self.roles.get(role)
        return entry is not None and entry.body is not None

    def order(self) -> float:
        """How often the op can be differentiated (inf: any number of times)."""
        if self.kind is not Kind.NONLINEAR:
            return float("inf")
        inner = []
        for name in ("jvp", "vjp"):
            entry = self.roles[name]
            if entry.body is None:
                continue
            if not entry.kind.traced:  # a callable: the reference, if any, goes further
                inner.append(0 if entry.reference is None else float("inf"))
                continue
            body = entry.body
            inner.append(body.binding.order() if isinstance(body, OpBase) else float("inf"))
        return 1 + min(inner, default=0)


# name -> Binding, weakly held: a binding lives as long as its op, any jaxpr
# that uses it, or any compiled program (lowering adds it to the keepalives).
_registry: weakref.WeakValueDictionary[str, Binding] = weakref.WeakValueDictionary()
_lock = threading.RLock()
# Registered bindings by (name without suffix, fingerprint of their callables): the
# only ones that can be equal to a new binding under that name.
_alike: dict[tuple, weakref.WeakSet] = {}
# Default names, per name without suffix: the suffixes of bindings that died (a heap,
# lowest first), and the lowest suffix never given.
_freed_suffixes: dict[str, list[int]] = {}
_next_suffix: dict[str, int] = {}


def register(
    binding: Binding, *, explicit_name: bool, replace: bool = False
) -> tuple[Binding, bool]:
    """Register `binding` under its name; return the binding to use and whether it is new.

    An equal binding already registered under the name is reused. A different
    one under an explicit name is an error unless `replace` is set, in which case
    it takes the name over (programs compiled earlier then call the new one);
    under a default name (taken from the callable's qualified name, e.g. a closure
    made in a loop) the new one gets the lowest free suffix "#2", "#3", ... Both
    cost the same whatever the number of bindings under one name.
    """
    with _lock:
        base = binding.name
        _check_name(base)
        binding.default_name = not explicit_name
        key = (base, _fingerprint(binding.callables()))
        for other in list(_alike.get(key, ())):
            if same_values(other.callables(), binding.callables()):
                return other, False
        existing = _registry.get(base)
        suffix = None  # the default name's suffix, if it got one
        if existing is not None and explicit_name:
            if not replace and not _defined_again(existing, binding):
                where = definition_site(existing.f)
                raise ValueError(
                    f"jaxbind: the name '{base}' is already used by another binding with "
                    "different callables"
                    + (f" (defined at {where[0]}:{where[1]})" if where else "")
                    + "; choose another name=, or pass replace=True to replace that binding"
                )
            # Its call sites go, so programs compiled for it make their site of the name
            # again, to this binding; the holders those programs keep alive move to it, so
            # that they own their new sites as they owned the old ones.
            existing.sites.drop()
            existing.sites.hand_over(binding.sites)
        elif existing is not None:
            suffix = _take_suffix(base)
            binding.name = f"{base}#{suffix}"
        _registry[binding.name] = binding
        _alike.setdefault(key, weakref.WeakSet()).add(binding)
        weakref.finalize(binding, _released, base, suffix, key)
        return binding, True


def definition_site(fn) -> tuple | None:
    """Where the function behind a callable was defined: (file, first line, qualified
    name, and a hash of the code), through wrappers (``__wrapped__``); None for a closure,
    a bound method, a partial or a callable object, which differ by their state. A
    notebook cell or a module run again defines its functions at the same site, so
    their named bindings replace the earlier ones."""
    fn = _unwrapped(fn)  # jaxbind's own wrappers (pytree API), functools.wraps
    if not isinstance(fn, types.FunctionType):
        return None  # bound methods, partials, callable objects: they differ by their state
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__closure__", None):
        return None  # closures of one definition differ by what they close over
    return (
        code.co_filename,
        code.co_firstlineno,
        code.co_qualname,
        hash((code.co_code, repr(code.co_consts))),
    )


def _defined_again(existing: Binding, binding: Binding) -> bool:
    """Whether `binding` is `existing` defined once more: its function is a new function
    object from the same definition site (a notebook cell or a module run again)."""
    site = definition_site(binding.f)
    return (
        site is not None
        and site == definition_site(existing.f)
        and _unwrapped(binding.f) is not _unwrapped(existing.f)
    )


def _unwrapped(fn):
    for _ in range(16):
        if not hasattr(fn, "__wrapped__"):
            break
        fn = fn.__wrapped__
    return fn


def _check_name(name: str) -> None:
    """A binding's name goes into programs as UTF-8 text: refuse one that is no such text
    when the op is made, rather than fail at every call."""
    if not isinstance(name, str):
        raise TypeError(f"jaxbind: a binding's name must be a str, got {type(name).__name__}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"jaxbind: the name {name!r} cannot be a binding's name: programs carry it as "
            f"UTF-8, and {exc.reason} at position {exc.start}. Pass name= with a valid "
            "string (a lone surrogate usually comes from decoding bytes with "
            "errors='surrogateescape')"
        ) from None
    if not name or "\0" in name:
        raise ValueError(
            f"jaxbind: the name {name!r} cannot be a binding's name: it must be a non-empty "
            "string without NUL characters"
        )


def _take_suffix(base: str) -> int:
    """The suffix for a new binding under the default name `base` that is taken: the
    lowest freed one, else the lowest never given (amortized O(log n) in the number of
    bindings under `base`)."""
    freed = _freed_suffixes.get(base)
    while freed:
        suffix = heapq.heappop(freed)
        if f"{base}#{suffix}" not in _registry:
            return suffix
    suffix = _next_suffix.get(base, 2)
    while f"{base}#{suffix}" in _registry:  # (an explicit name may look like a default one)
        suffix += 1
    _next_suffix[base] = suffix + 1
    return suffix


def _released(base: str, suffix: int | None, key: tuple) -> None:
    """A registered binding died: its suffix may be given again (lowest first), and its
    entry among the alike ones goes once it was the last."""
    with _lock:
        if suffix is not None:
            heapq.heappush(_freed_suffixes.setdefault(base, []), suffix)
        alike = _alike.get(key)
        if alike is not None and not any(True for _ in alike):  # iterating skips the dead
            del _alike[key]


def _fingerprint(value):
    """A hashable summary of a registration: equal whenever `same_values` holds (it
    keeps the identities that `same_values` compares, and only types elsewhere)."""
    t = type(value)
    if t in (tuple, list):
        return t, tuple(_fingerprint(v) for v in value)
    if t is dict:
        return t, tuple(sorted((repr(k), _fingerprint(v)) for k, v in value.items()))
    if isinstance(value, types.MethodType):
        return t, id(value.__self__), id(value.__func__)
    if isinstance(value, functools.partial):
        return t, _fingerprint(value.func)
    if t is types.FunctionType:
        return t, id(value)  # functions compare by identity
    if t is types.BuiltinFunctionType:  # equal when bound to the same object
        return t, id(getattr(value, "__self__", None)), value.__qualname__
    return t


def lookup(name: str) -> Binding | None:
    return _registry.get(name)


def registered_names() -> list[str]:
    return sorted(_registry.keys())
