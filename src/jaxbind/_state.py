"""State: what an op sets up once per call site and uses at every call (a plan, a
handle, a factorization), declared with ``@jaxbind.state`` and given to an op as its
``state=`` option.

This module holds the declaration (`StateDef`) and what a running body reads
(`load_state`, `current_state`); the run time (_runtime.state) sets states up, shares
them between call sites and frees them with the executables that use them. The
lifetime rules are in docs/state.md.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, overload

from . import _ext
from ._kwargs import encode_kwargs

__all__ = [
    "CONCURRENCY",
    "StateDef",
    "Watcher",
    "current_state",
    "load_state",
    "outside_programs",
    "placed",
    "setting_up",
    "setup_place",
    "setup_reentered",
    "state",
    "teardown_message",
    "thread_stack",
    "using",
    "watchers",
]

# How the callables of one op use its state at once (see `state`): the policies of the
# trampoline's state cells, by the names it defines (cpp/state_cell.h).
CONCURRENCY: tuple[str, ...] = _ext.state_policies
_POOL_DEFAULT = 4


@dataclass(frozen=True, eq=False)
class StateDef:
    """A state declaration, checked (made by `state`).

    Attributes:
      setup: ``setup(**arguments)``, returning the object.
      name: the setup's name, for messages.
      params: the setup's keyword-only parameters: the op's static keyword arguments
        (and `key` inputs) it receives; ``all_kwargs``: it takes ``**kwargs`` (every
        static keyword argument).
      required: those of `params` without a default.
      concurrency: "lock", "pool" or "shared"; pool_size: objects at most, for "pool".
      key: names of the op's inputs the object depends on.
      teardown: ``teardown(obj)`` when the object is freed, or None.
    """

    setup: Callable
    name: str
    params: tuple[str, ...]
    required: frozenset
    all_kwargs: bool
    concurrency: str = "lock"
    pool_size: int = 1
    key: tuple[str, ...] = ()
    teardown: Callable | None = None

    def __call__(self, **arguments):
        """Run the setup (as the run time does)."""
        return self.setup(**arguments)

    def __repr__(self):
        return f"<jaxbind.state {self.name} ({self.concurrency})>"

    def arguments(self, given: dict, label: str) -> dict:
        """The setup's arguments among a call's keyword arguments `given` (those of its
        key inputs aside); `label` names the op and role in the error if one is missing."""
        given = {k: v for k, v in given.items() if k != "batch_axes" and k not in self.key}
        chosen = given if self.all_kwargs else {k: given[k] for k in self.params if k in given}
        missing = sorted(self.required - set(chosen) - set(self.key))
        if missing:
            raise TypeError(
                f"jaxbind: {label}: its state's setup {self.name!r} needs the keyword "
                f"argument {missing[0]!r}, which the call does not give; pass it to the op, "
                "or give the setup parameter a default"
            )
        return chosen

    def refuse_reentry(self, kwargs_dump, label: str) -> None:
        """At a bind of an op with this state and keyword arguments `kwargs_dump` (a
        KwargsDump): ValueError if a setup running on this thread is making the state
        this call would use (this declaration, with equal setup arguments). For a state
        with key= the key values are not known at the bind; the run time refuses such a
        call instead. (A method, so the primitive reaches it through the op's options
        without importing this module.)"""
        setups = getattr(_local, "setups", None)
        if not setups or self.key:
            return
        try:
            frozen = encode_kwargs(self.arguments(kwargs_dump.to_dict(), label), "state setup").blob
        except TypeError:
            return  # (the call fails later, naming the missing argument)
        if any(s is self and f == frozen for s, f in setups):
            raise ValueError(setup_reentered(label, self))


@overload
def state(setup: Callable, /) -> StateDef: ...
@overload
def state(
    *,
    concurrency: str = "lock",
    pool_size: int | None = None,
    key: tuple[str, ...] | list[str] = (),
    teardown: Callable | None = None,
) -> Callable[[Callable], StateDef]: ...
def state(
    setup: Callable | None = None,
    /,
    *,
    concurrency: str = "lock",
    pool_size: int | None = None,
    key: tuple[str, ...] | list[str] = (),
    teardown: Callable | None = None,
) -> Any:
    """Declare a state: an object set up once per call site and used by every call.

    Used as ``@jaxbind.state`` or ``@jaxbind.state(concurrency=..., key=...,
    teardown=...)`` on a setup function whose keyword-only parameters name the op's
    static keyword arguments it needs; give the result to an op as ``state=``. The
    setup runs when XLA instantiates a call site (when the program is compiled or
    loaded), not when it is traced; every role of the op at sites with equal setup
    arguments shares one object, which is freed (``teardown(obj)``, if given) when the
    last executable using it is freed. See docs/state.md.

    Args:
      setup: ``setup(*, name=..., ...)`` returning the object.
      concurrency: how calls running at once (several devices, jaxbind's parallel batch
        loop) use it: ``"lock"`` (default) one call at a time; ``"pool"`` up to
        ``pool_size`` objects (set up as needed), each used by one call at a time;
        ``"shared"`` all at once (the object is thread-safe). A call never waits for an
        object its own thread holds (a body that calls its own op): under ``"lock"``,
        or with every object of a pool in use, such a nested call fails, naming the op.
        A setup must not call an op that uses the state it is making: such a call
        fails at once, naming the op.
      pool_size: the most objects of a ``"pool"`` state (default 4).
      key: names of the op's inputs the object depends on (traced, e.g. NUFFT
        points), as the op's function names them (in ``get_*_call``: its abstract
        function): the setup gets them as NumPy arrays under these names, runs at the
        first call, and again only when their values change (the last few are kept).
      teardown: ``teardown(obj)``, called when an object is freed (never after the
        interpreter has begun to exit). A setup's error fails the compilation (or the
        call) with a message that names the op and the state and ends with the setup's
        traceback; a teardown's error becomes a RuntimeWarning the same way.
    """

    def make(fn: Callable) -> StateDef:
        return _declare(fn, concurrency, pool_size, key, teardown)

    if setup is not None:
        return make(setup)
    return make


def _declare(fn, concurrency, pool_size, key, teardown) -> StateDef:
    where = f"jaxbind.state({getattr(fn, '__qualname__', fn)!r})"
    if not callable(fn):
        raise TypeError(f"jaxbind.state: the setup must be a function, got {fn!r}")
    if concurrency not in CONCURRENCY:
        raise ValueError(f"{where}: concurrency must be one of {CONCURRENCY}, got {concurrency!r}")
    if pool_size is not None and concurrency != "pool":
        raise TypeError(f'{where}: pool_size is for concurrency="pool"')
    size = _POOL_DEFAULT if pool_size is None else pool_size
    if concurrency == "pool" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"{where}: pool_size must be a positive int, got {pool_size!r}")
    if isinstance(key, str) or not all(isinstance(k, str) for k in key):
        raise TypeError(
            f"{where}: key must be a tuple of argument names, e.g. key=('x',), got {key!r}"
        )
    if teardown is not None and not callable(teardown):
        raise TypeError(f"{where}: teardown must be a function of the object, got {teardown!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: the setup's signature cannot be read") from None
    params, required, all_kwargs = [], set(), False
    for p in signature.parameters.values():
        if p.kind is p.KEYWORD_ONLY:
            params.append(p.name)
            if p.default is p.empty:
                required.add(p.name)
        elif p.kind is p.VAR_KEYWORD:
            all_kwargs = True
        elif p.kind is not p.VAR_POSITIONAL and p.default is p.empty:
            raise TypeError(
                f"{where}: the setup takes the op's keyword arguments as keyword-only "
                f"parameters (def {fn.__name__}(*, {p.name}, ...)); {p.name!r} is positional"
            )
    missing = [k for k in key if k not in params and not all_kwargs]
    if missing:
        raise TypeError(
            f"{where}: key names {missing[0]!r}, which the setup does not take; add it as a "
            f"keyword-only parameter (def {fn.__name__}(*, {missing[0]}, ...))"
        )
    return StateDef(
        setup=fn,
        name=getattr(fn, "__qualname__", repr(fn)),
        params=tuple(params),
        required=frozenset(required),
        all_kwargs=all_kwargs,
        concurrency=concurrency,
        pool_size=size if concurrency == "pool" else 1,
        key=tuple(key),
        teardown=teardown,
    )


# The objects in use by the callables running on this thread (a stack: a callable may
# call another op eagerly).
_local = threading.local()


def thread_stack() -> list:
    """This thread's stack of the objects in use by its running bodies."""
    try:
        return _local.stack
    except AttributeError:
        _local.stack = []
        return _local.stack


class using:
    """While a body runs: its state object is the current one on this thread."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __enter__(self):
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self.obj)
        return self.obj

    def __exit__(self, *exc):
        _local.stack.pop()


def current_state():
    """The state object of the callable running on this thread; LookupError if none."""
    stack = getattr(_local, "stack", None)
    if not stack:
        raise LookupError(
            "jaxbind.load_state: no state here. It gives the state of an op made with "
            "state=..., inside one of its callables while it runs"
        )
    return stack[-1]


def load_state(kwargs_dump=None):
    """The state object of the op whose callable is running (``state=`` option).

    For callables of ``get_linear_call`` / ``get_nonlinear_call``, which are called as
    ``f(out, args, kwargs_dump)``: ``jaxbind.load_state(kwargs_dump)`` gives the object
    set up for this call site, as ``load_kwargs(kwargs_dump)`` gives its keyword
    arguments. Valid while the callable runs (keep no reference to it for later: under
    ``concurrency="lock"`` or ``"pool"`` it is this call's alone only until it returns).
    pytree-API bodies get it as their ``state`` argument instead.
    """
    del kwargs_dump  # the object is this thread's running call's
    return current_state()


# --- setups in progress ----------------------------------------------------------
# A setup that calls an op using the state it is making would wait for itself: the
# nested call's site needs that state, set up once, by the setup still running (on XLA's
# compile threads, so even a lock that knows its owner cannot tell). Each thread keeps
# the setups it runs, so that the op's bind (on the calling thread, before anything is
# compiled) and the run time (for a program compiled without a trace here: an exported
# one) refuse at once.


def _setups() -> list:
    try:
        return _local.setups
    except AttributeError:
        _local.setups = []
        return _local.setups


@contextlib.contextmanager
def setting_up(sdef: StateDef, frozen: bytes) -> Iterator[None]:
    """While a setup of `sdef` runs on this thread, with setup arguments whose encoding
    (key inputs aside) is `frozen`."""
    setups = _setups()
    setups.append((sdef, frozen))
    try:
        yield
    finally:
        setups.pop()


# --- where a setup runs ------------------------------------------------------------
# A kernel for CUDA's state is set up per device, at the device's first call, on the
# call's thread: its setup is told the device and the call's stream (a C state's
# jaxbind_setup fields, jaxbind.current_call() for a Python setup).


@contextlib.contextmanager
def placed(platform: str, stream: int, device: int) -> Iterator[None]:
    """While a setup runs for a call on `device` of `platform`, on `stream`."""
    before = getattr(_local, "place", None)
    _local.place = (platform, stream, device)
    try:
        yield
    finally:
        _local.place = before


def setup_place() -> tuple[str, int, int] | None:
    """(platform, stream, device) of the call a setup running on this thread is for, or
    None (a setup for the CPU, or no setup)."""
    return getattr(_local, "place", None)


def setup_reentered(label: str, sdef: StateDef) -> str:
    """The message of a call that would wait for the setup of its own state."""
    return (
        f"jaxbind: {label}: called while its state {sdef.name!r} is being set up for it: the "
        "setup calls the op (directly, or through a program that contains it), whose call "
        "needs the very object the setup is making, so it would wait for itself forever. "
        "A setup must not call an op that uses the state it is making: compute what it "
        "needs with NumPy or plain JAX, or call the op before or after, outside the setup"
    )


def teardown_message(label: str, sdef: StateDef, exc: BaseException) -> str:
    """What a failed teardown is reported as (a warning in programs, a row in checks)."""
    return (
        f"jaxbind: {label}: the teardown of its state {sdef.name!r} failed: "
        f"{type(exc).__name__}: {exc}"
    )


@contextlib.contextmanager
def outside_programs(
    binding,
    kwargs: dict,
    args,
    label: str,
    role: str = "f",
    teardown_failed: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """A state of its own for a body of `binding`'s `role` called outside any program
    (jaxbind.testing calls callables directly): set up from the call's keyword arguments
    (and key inputs in `args`), current while the block runs, torn down after. A
    teardown that raises is handed to `teardown_failed` (its message) if given, else
    raised: the body's call did not fail."""
    options = binding.options
    sdef = options.state
    if sdef is None:
        yield
        return
    import numpy as np

    arguments = sdef.arguments(kwargs, label)
    key_at = binding.role(role).positions(options.state_key, options.fixed)
    arguments.update(zip(sdef.key, (np.array(args[i]) for i in key_at)))
    obj = sdef.setup(**arguments)
    try:
        with using(obj):
            yield
    finally:
        if sdef.teardown is not None:
            try:
                sdef.teardown(obj)
            except Exception as exc:
                if teardown_failed is None:
                    raise
                teardown_failed(teardown_message(label, sdef, exc))


# --- watching the run time (jaxbind.testing.check's state rows) -------------------
# The run time (_runtime.state) tells each watcher what it does with states; testing's
# Watch (jaxbind/testing/watch.py) is the one watcher, registered here while a check
# looks. Empty otherwise: then the run time tells no one.


class Watcher(Protocol):
    """What the run time tells a watcher. `shared` is the run time's state (its
    ``sdef``, ``label``, ``count`` and ``objects``)."""

    def noted(self, shared: Any, event: str, obj: Any) -> None:
        """A call site leased `shared` ("lease"), or it set `obj` up ("setup") or tore
        it down ("teardown")."""

    def used(self, shared: Any, obj: Any, start: float, end: float) -> None:
        """A Python body used `obj`, lent by `shared`, from `start` to `end`."""

    def teardown_failed(self, message: str, shared: Any = None) -> None:
        """A teardown raised (`message`), in a program (`shared`) or a direct call."""


watchers: list[Watcher] = []
