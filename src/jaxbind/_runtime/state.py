"""Run time of states (``state=``, see jaxbind._state): set up, shared, used, freed.

A call site of an op with a state holds a `Lease` (in its `Resolved` description, so
in its ``_ext.Site``, which the executable owns: see cpp/site.h). Leases of sites with
equal setup arguments (any role, any executable) share one `Shared` state from the
registry below; it counts them, and tears its objects down when the last lease goes,
that is, when the last executable that uses it is freed. A state with ``key=`` is set
up at calls instead (instantiate has no buffers): its lease keeps the last few key
values, each with its own shared state.

The trampoline calls a stateful site's body through `StatefulBody`, which takes an
object under the state's concurrency policy and makes it the thread's current state
(what ``state=`` and ``jaxbind.load_state`` give) while the body runs.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import warnings

import numpy as np

from .._kwargs import encode_kwargs
from .._state import StateDef, _watches
from .._state import thread_stack as _stack

__all__ = ["Lease", "StatefulBody", "lease_for", "live_states"]

_KEYS = 4  # key values a lease keeps set up (a small LRU)

_lock = threading.Lock()
_registry: dict[tuple, Shared] = {}


class SetupError(RuntimeError):
    """A state's setup failed (the message names the op, the role and the setup)."""


class Shared:
    """One state: its objects (one, or up to pool_size for "pool"), counted by leases."""

    def __init__(self, key: tuple, sdef: StateDef, arguments: dict, label: str):
        self.key, self.sdef, self.arguments, self.label = key, sdef, arguments, label
        self.count = 0
        self.objects: list = []  # every object made
        self.idle: list = []
        self.cond = threading.Condition()
        # "lock": the lock of its one object (the fast path of StatefulBody)
        self.exclusive = threading.Lock() if sdef.concurrency == "lock" else None

    def make(self):
        try:
            obj = self.sdef.setup(**self.arguments)
        except Exception as exc:
            raise SetupError(
                f"jaxbind: {self.label}: the setup of its state {self.sdef.name!r} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self.objects.append(obj)
        for w in _watches:
            w.noted(self, "setup", obj)
        return obj

    def use(self):
        """An object for one call, and what gives it back (see StatefulBody)."""
        if self.sdef.concurrency == "shared":
            return self.objects[0] if self.objects else self._first()
        with self.cond:
            while not self.idle:
                if len(self.objects) < self.sdef.pool_size:
                    return self.make()
                self.cond.wait()
            return self.idle.pop()

    def _first(self):
        """The first object (set up now, if none is yet), idle."""
        with self.cond:
            if not self.objects:
                self.idle.append(self.make())
            return self.objects[0]

    def give_back(self, obj) -> None:
        if self.sdef.concurrency == "shared":
            return
        with self.cond:
            self.idle.append(obj)
            self.cond.notify()

    def close(self) -> None:
        objects, self.objects, self.idle = self.objects, [], []
        for w in _watches:
            for obj in objects:
                w.noted(self, "teardown", obj)
        teardown = self.sdef.teardown
        if teardown is None or sys.is_finalizing():
            return
        for obj in objects:
            try:
                teardown(obj)
            except Exception as exc:
                warnings.warn(
                    f"jaxbind: {self.label}: the teardown of its state {self.sdef.name!r} "
                    f"failed: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=1,
                )


def _acquire(key: tuple, sdef: StateDef, arguments: dict, label: str, eager: bool) -> Shared:
    with _lock:
        shared = _registry.get(key)
        if shared is None:
            shared = _registry[key] = Shared(key, sdef, arguments, label)
        shared.count += 1
    if eager and not shared.objects:
        try:
            shared._first()
        except BaseException:
            _release(shared)
            raise
    return shared


def _release(shared: Shared) -> None:
    with _lock:
        shared.count -= 1
        if shared.count > 0:
            return
        if _registry.get(shared.key) is shared:
            del _registry[shared.key]
    shared.close()


def live_states() -> int:
    """How many states are set up now (for tests: teardowns equal setups after
    ``jax.clear_caches()``)."""
    with _lock:
        return len(_registry)


class Lease:
    """One call site's hold on its op's state (released when the site is freed).

    Its states are placed: ``()`` on the CPU (set up when XLA instantiates the site, if
    `eager`, else at its first call), ``("cuda", device)`` on a GPU (at the first call on
    that device, inside the call: XLA gives no stream when it instantiates a site). A
    state with a key has one per place and key value (the last few kept)."""

    def __init__(self, binding, sdef: StateDef, arguments: dict, label: str, key_at, eager):
        self.sdef, self.label, self.key_at = sdef, label, key_at
        self.base = (id(binding), binding.name, id(sdef), _frozen(arguments))
        self.arguments = arguments
        self.shared: Shared | None = None  # the CPU's, once set up (the fast path)
        self.placed: dict[tuple, Shared] = {}  # place -> Shared, without a key
        self.keyed: collections.OrderedDict = collections.OrderedDict()  # key -> (copies, Shared)
        self.mu = threading.Lock()
        if eager and not sdef.key:
            self.shared = self.placed[()] = _acquire(self.base, sdef, arguments, label, True)

    def state_for(self, args, place: tuple = (), on_host=np.asarray) -> Shared:
        """The state for a call with inputs `args` at `place`, set up now if need be;
        `on_host` gives a key input's values as a NumPy array."""
        if not self.sdef.key:
            with self.mu:
                shared = self.placed.get(place)
                if shared is None:
                    key = (*self.base, *place)
                    shared = _acquire(key, self.sdef, self.arguments, self.label, True)
                    self.placed[place] = shared
                    if not place:
                        self.shared = shared
                return shared
        inputs = [on_host(args[i]) for i in self.key_at]
        with self.mu:
            for k, (copies, shared) in self.keyed.items():
                if k[0] == place and all(_same(a, b) for a, b in zip(copies, inputs)):
                    self.keyed.move_to_end(k)
                    return shared
            copies = [a.copy() for a in inputs]
            k = (place, *((a.dtype.str, a.shape, a.tobytes()) for a in copies))
            arguments = dict(self.arguments, **dict(zip(self.sdef.key, copies)))
            shared = _acquire((*self.base, *k), self.sdef, arguments, self.label, eager=True)
            self.keyed[k] = (copies, shared)
            while len(self.keyed) > _KEYS:
                _release(self.keyed.popitem(last=False)[1][1])
            return shared

    def __del__(self):
        if sys.is_finalizing():
            return
        for shared in self.placed.values():
            _release(shared)
        for _, shared in self.keyed.values():
            _release(shared)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=False)


def _frozen(arguments: dict) -> bytes:
    """Equal setup arguments, equal bytes (their keyword-argument encoding)."""
    return encode_kwargs(arguments, "state setup").blob


def lease_for(binding, role, dump, label: str, eager: bool) -> Lease | None:
    """The lease of a call site of `binding`'s `role` with keyword arguments `dump` (None
    if the op has no state); its CPU state set up now if `eager` and it has no key, whose
    inputs the role's body finds at their positions in its own layout."""
    sdef = binding.options.state
    if sdef is None:
        return None
    try:
        arguments = sdef.arguments(dump.to_dict(), label)
    except TypeError as exc:
        raise SetupError(str(exc)) from None
    options = binding.options
    key_at = binding.role(role).positions(options.state_key, options.fixed)
    if None in key_at:  # (the op's definition check refuses such roles: see check_state_key)
        raise SetupError(f"jaxbind: {label}: this role does not receive its state's key inputs")
    return Lease(binding, sdef, arguments, label, key_at, eager)


class StatefulBody:
    """A stateful site's body as the trampoline calls it, ``(out, args, kwargs_dump)``:
    an object of the state taken under its policy, current while the body runs."""

    __slots__ = ("body", "lease", "__weakref__")

    def __init__(self, body, lease: Lease):
        self.body, self.lease = body, lease

    def __call__(self, out, args, kwargs_dump):
        self.run(self.lease.shared or self.lease.state_for(args), out, args, kwargs_dump)

    def on_gpu(self, device: int, on_host, out, args, kwargs_dump) -> None:
        """A GPU call (from the GPU dispatcher): the state of its device; `on_host` copies
        a key input to the host."""
        shared = self.lease.state_for(args, ("cuda", device), on_host)
        self.run(shared, out, args, kwargs_dump)

    def run(self, shared: Shared, out, args, kwargs_dump) -> None:
        """The body, with an object of `shared` current (taken under its policy)."""
        body = self.body if not _watches else self._noting(shared)
        stack = _stack()
        if shared.exclusive is not None:  # "lock": one object, one call at a time
            with shared.exclusive:
                stack.append(shared.objects[0])
                try:
                    body(out, args, kwargs_dump)
                finally:
                    stack.pop()
            return
        obj = shared.use()
        stack.append(obj)
        try:
            body(out, args, kwargs_dump)
        finally:
            stack.pop()
            shared.give_back(obj)

    def _noting(self, shared: Shared):
        """The body, telling each `Watch` which object it used, from when to when."""

        def noted(out, args, kwargs_dump):
            obj, start = _stack()[-1], time.perf_counter()
            try:
                self.body(out, args, kwargs_dump)
            finally:
                end = time.perf_counter()
                for w in _watches:
                    w.used(shared, obj, start, end)

        return noted
