"""Bindings: the user's callables for one op, their roles, and the name registry.

A binding holds everything `get_linear_call` / `get_nonlinear_call` were
given. Each role is one callable of the binding plus the abstract function
that describes its outputs:

  linear       "f" (f, abstract)        <-> "T" (f_T, abstract_T)
  multilinear  "f" (f, abstract);  "T<i>" (f_T[i], abstract_T[i]), the
               transpose with respect to argument i
  nonlinear    "f" (f, abstract);  "jvp" (f_jvp, abstract) <-> "vjp" (f_vjp, abstract_T)

Bindings are registered by name so that a compiled program, which names its
binding by string, can find the callable again (see `resolve_site`).
"""

from __future__ import annotations

import enum
import hashlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from ._kwargs import decode_kwargs, encode_kwargs

__all__ = ["Kind", "Binding", "register", "lookup", "resolve_site", "site_digest"]


class Kind(enum.Enum):
    LINEAR = "linear"
    MULTILINEAR = "multilinear"
    NONLINEAR = "nonlinear"


@dataclass(eq=False)
class Binding:
    """The callables and settings of one jaxbind op (one JAX primitive)."""

    name: str
    kind: Kind
    f: Callable
    transposes: Callable | tuple | None  # f_T (linear) or one per argument (multilinear)
    derivatives: tuple | None            # (f_jvp, f_vjp) for nonlinear ops
    abstract: Callable
    abstract_T: Callable | tuple | None
    first_n_args_fixed: int
    can_batch: bool
    platform_mode: str = "device"  # GPU calls: "device" (CUDA arrays) or "host" (NumPy copies)
    primitive: object = field(default=None, repr=False)
    __weakref__: object = field(default=None, init=False, repr=False, compare=False)

    def callables(self) -> tuple:
        """Everything user-supplied, to tell equal bindings from clashing ones."""
        return (self.kind, self.f, self.transposes, self.derivatives, self.abstract,
                self.abstract_T, self.first_n_args_fixed, self.can_batch, self.platform_mode)

    def callable_for(self, role: str) -> Callable:
        if role == "f":
            return self.f
        if self.kind is Kind.LINEAR and role == "T":
            fn = self.transposes
        elif self.kind is Kind.NONLINEAR and role in ("jvp", "vjp"):
            fn = self.derivatives[0 if role == "jvp" else 1]
        elif self.kind is Kind.MULTILINEAR and role[:1] == "T" and role[1:].isdigit():
            index = int(role[1:])
            fn = self.transposes[index] if index < len(self.transposes) else None
        else:
            raise LookupError(f"jaxbind: binding '{self.name}' ({self.kind.value}) has no role {role!r}")
        if fn is None:
            raise NotImplementedError(
                f"jaxbind: '{self.name}' was given no callable for {describe_role(role)}; "
                "pass one to get_linear_call to transpose or differentiate this op")
        return fn

    def abstract_for(self, role: str) -> Callable:
        self.callable_for(role)  # a role without a callable is reported as such
        if role in ("f", "jvp"):
            return self.abstract
        if role in ("T", "vjp"):
            fn = self.abstract_T
        else:  # multilinear "T<i>"
            index = int(role[1:])
            fn = self.abstract_T[index] if index < len(self.abstract_T) else None
        if fn is None or not callable(fn):
            raise NotImplementedError(
                f"jaxbind: '{self.name}' was given no abstract function for {describe_role(role)}")
        return fn


def describe_role(role: str) -> str:
    if role == "f":
        return "the function"
    if role == "T":
        return "the transpose"
    if role in ("jvp", "vjp"):
        return f"the {role.upper()}"
    return f"the transpose with respect to argument {role[1:]}"


# name -> Binding, weakly held: a binding lives as long as its op, any jaxpr
# that uses it, or any compiled program (lowering adds it to the keepalives).
_registry: "weakref.WeakValueDictionary[str, Binding]" = weakref.WeakValueDictionary()
_lock = threading.Lock()


def register(binding: Binding, *, explicit_name: bool, replace: bool = False
             ) -> tuple[Binding, bool]:
    """Register `binding` under its name; return the binding to use and whether it is new.

    An equal binding already registered under the name is reused. A different
    one under an explicit name is an error unless `replace` is set, in which case
    it takes the name over (programs compiled earlier then call the new one);
    under a default name (taken from
    the callable's qualified name, e.g. a closure made in a loop) the new one
    gets the next free suffix "#2", "#3", ...
    """
    with _lock:
        base, suffix = binding.name, 1
        while True:
            existing = _registry.get(binding.name)
            if existing is None:
                _registry[binding.name] = binding
                return binding, True
            if existing.callables() == binding.callables():
                return existing, False
            if explicit_name and replace:
                _registry[binding.name] = binding
                return binding, True
            if explicit_name:
                raise ValueError(
                    f"jaxbind: the name '{base}' is already used by another binding with "
                    "different callables; choose another name=, or pass replace=True to "
                    "replace that binding")
            suffix += 1
            binding.name = f"{base}#{suffix}"


def lookup(name: str) -> Binding | None:
    return _registry.get(name)


def registered_names() -> list[str]:
    return sorted(_registry.keys())


def site_digest(name: str, role: str, blob: bytes) -> int:
    """Signed 64-bit digest naming one call site (binding, role, keyword arguments)."""
    h = hashlib.blake2b(digest_size=8)
    for part in (name.encode(), role.encode(), blob):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return int.from_bytes(h.digest(), "little", signed=True)


def resolve_site(name: str, role: str, blob: bytes, digest: int):
    """Called by the trampoline on the first call of a site.

    Returns (callable, kwargs_dump, label, loop, platform_mode). `loop` is None, or, for a call
    batched by jaxbind itself, (levels, batched): the trampoline then calls the
    callable once per batch element, on the views with the leading `levels` axes
    dropped, of every output and of each input marked in `batched`.
    """
    binding = lookup(name)
    if binding is None:
        raise LookupError(
            f"no binding named '{name}' is registered in this process. Import or run the "
            "code that creates it (jaxbind.get_linear_call / get_nonlinear_call) before "
            "calling the program")
    if site_digest(name, role, blob) != digest:
        raise ValueError(f"the call attributes of '{name}' are inconsistent (digest mismatch); "
                         "the program was modified or corrupted")
    fn, dump = binding.callable_for(role), decode_kwargs(blob)
    label, loop = f"'{name}' ({describe_role(role)})", None
    if not binding.can_batch and "batch_axes" in dump._values:  # batched by jaxbind
        values = dump.to_dict()
        batch_axes = values.pop("batch_axes")  # all leading (see _batching._batch_looped)
        dump = encode_kwargs(values)
        loop = (max(len(ax) for ax in batch_axes), tuple(bool(ax) for ax in batch_axes))
        label += ", batched"
    return fn, dump, label, loop, binding.platform_mode
