"""Run time of states (``state=``, see jaxbind._state): set up, shared, used, freed.

A call site of an op with a state holds a `Lease` (in its `SiteDescription`, so
in its ``_ext.Site``, which the executable owns: see cpp/site.h). Leases of sites with
equal setup arguments (any role, any executable) share one state (`StateObjects`) from the
registry below; it counts them, and tears its objects down when the last lease goes,
that is, when the last executable that uses it is freed. A state with ``key=`` is set
up at calls instead (instantiate has no buffers): its lease keeps the last few key
values, each with its own state.

The trampoline calls a stateful site's body through `StatefulBody`, which takes an
object under the state's concurrency policy and makes it the thread's current state
(what ``state=`` and ``jaxbind.load_state`` give) while the body runs.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import sys
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np

from .. import _ext
from .._avals import XLA_ELEMENT_TYPES
from .._kernels.state import state_address
from .._kwargs import encode_kwargs
from .._state import StateDef, placed, setting_up, setup_reentered, teardown_message
from .._state import thread_stack as _stack
from .._state import watchers as _watchers
from .report import user_traceback

__all__ = [
    "KernelState",
    "Lease",
    "StatefulBody",
    "exiting",
    "lease_for",
    "live_states",
    "mark_exit",
]

_lock = threading.Lock()
_registry: dict[tuple, StateObjects] = {}

# How a CUDA device is made current for its states' teardowns: a context manager of the
# device's ordinal, set by .gpu, which holds the CUDA driver (and imports this module).
device_current: Callable[[int], contextlib.AbstractContextManager] | None = None


class SetupError(RuntimeError):
    """A state's setup failed (the message names the op, the role and the setup, and ends
    with the setup's traceback; the setup's error is its cause)."""

    reported = True  # (report.format_callback_error passes the message on as it is)


UNMADE = object()  # a slot whose object is not set up yet (a setup may return None)
_held = threading.local()  # .states: the states whose objects this thread's bodies hold


def _holding() -> list:
    try:
        return _held.states
    except AttributeError:
        _held.states = []
        return _held.states


class StateObjects:
    """One state: its objects (one, or up to pool_size for "pool"), counted by leases.

    Which object a call uses, and when, is up to its `cell` (``_ext.StateCell``, see
    cpp/state_cell.h): kernels take objects there without the GIL, Python bodies through
    `use` and `give_back`, so both keep to one policy. ``slots[k]`` is object k (UNMADE
    until made)."""

    def __init__(self, key: tuple, sdef: StateDef, arguments: dict, label: str, place: tuple):
        self.key, self.sdef, self.arguments, self.label = key, sdef, arguments, label
        self.count = 0
        self.deferred = False  # freed while a body held one of its objects (see close)
        self.slots: list = [UNMADE] * sdef.pool_size
        self.first_lock = threading.Lock()
        self.maker: int | None = None  # the thread setting up the first object, meanwhile
        self.frozen = _frozen({k: v for k, v in arguments.items() if k not in sdef.key})
        self.cell = _ext.StateCell(sdef.concurrency, sdef.pool_size, self, label, sdef.name)
        # the CUDA device of its objects (None: the CPU), from its place (see Lease)
        self.device: int | None = place[1] if place else None

    @property
    def objects(self) -> list:
        """Every object made."""
        return [obj for obj in self.slots if obj is not UNMADE]

    def make(self):
        try:
            with setting_up(self.sdef, self.frozen):
                obj = self.sdef.setup(**self.arguments)
        except Exception as exc:
            raise SetupError(
                f"jaxbind: {self.label}: the setup of its state {self.sdef.name!r} failed: "
                f"{type(exc).__name__}: {exc}\n{user_traceback(exc, 'the setup')}"
            ) from exc
        for w in _watchers:
            w.noted(self, "setup", obj)
        return obj

    def use(self) -> int:
        """The slot of an object for one call (made now if the policy allows one more),
        taken until `give_back`."""
        slot = self.cell.acquire()
        if slot < 0:  # (a slot to make the object of)
            slot = -1 - slot
            try:
                self.slots[slot] = self.make()
            except BaseException:
                self.cell.abandon(slot)
                raise
        return slot

    def give_back(self, slot: int) -> None:
        self.cell.release(slot)

    def provide(self, slot: int, make: bool) -> int:
        """For a kernel (the trampoline asks, with the GIL): the address of object `slot`,
        made first if `make` (the first object, if its setup was left to the first call)."""
        if make:
            self.slots[slot] = self.make()
        elif self.slots[slot] is UNMADE:
            self.first()
        return state_address(self.slots[slot], self.label, self.sdef.name)

    @property
    def pending(self) -> bool:
        """No first object yet (its setup failed, or runs on another thread)."""
        return self.slots[0] is UNMADE if self.slots else False

    def first(self, wait: bool = True) -> None:
        """The first object, set up now if none is yet. Two threads may ask at once: one
        sets it up, the other waits for it, unless not `wait` (XLA instantiating a site:
        the setup running elsewhere may be the one compiling this site, through a program
        it calls; the site's first call asks again). A call on the thread running the
        setup is refused: it would wait for itself."""
        me = threading.get_ident()
        if self.maker == me:
            raise SetupError(setup_reentered(self.label, self.sdef))
        if not self.first_lock.acquire(blocking=wait):
            return
        try:
            if self.pending:
                self.maker = me
                try:
                    if self.sdef.concurrency == "pool":
                        self.give_back(self.use())
                    else:
                        self.slots[0] = self.make()
                finally:
                    self.maker = None
        finally:
            self.first_lock.release()

    def close(self) -> None:
        """Tear the objects down once no call uses them. Freed on a thread whose body
        holds one of them (a nested call that drops the caller's key value from its
        lease's last few), it would wait for itself: the body's thread does it when its
        use ends (`done`)."""
        if self in _holding():
            self.deferred = True
            return
        self.cell.close()  # (no call uses an object after this)
        objects, self.slots = self.objects, []
        for w in _watchers:
            for obj in objects:
                w.noted(self, "teardown", obj)
        teardown = self.sdef.teardown
        if teardown is None or exiting() or not objects:
            return
        with self._on_its_device():
            self._tear_down(teardown, objects)

    def _on_its_device(self):
        """The objects' device current while they are torn down, as it was when they
        were set up (nothing on the CPU; see `device_current`)."""
        if self.device is None or device_current is None:
            return contextlib.nullcontext()
        return device_current(self.device)

    def _tear_down(self, teardown, objects: list) -> None:
        for obj in objects:
            try:
                teardown(obj)
            except Exception as exc:
                message = (
                    f"{teardown_message(self.label, self.sdef, exc)}\n"
                    f"{user_traceback(exc, 'the teardown')}"
                )
                for w in _watchers:
                    w.teardown_failed(message, self)
                warnings.warn(message, RuntimeWarning, stacklevel=1)


def _acquire(
    key: tuple,
    sdef: StateDef,
    arguments: dict,
    label: str,
    eager: bool,
    wait: bool = True,
    place: tuple = (),
) -> StateObjects:
    with _lock:
        state = _registry.get(key)
        if state is None:
            state = _registry[key] = StateObjects(key, sdef, arguments, label, place)
        state.count += 1
    for w in _watchers:  # (a kernel's uses are unseen: its site's lease is seen here)
        w.noted(state, "lease", None)
    if eager and not state.objects:
        try:
            state.first(wait)
        except BaseException:
            _release(state)
            raise
    return state


def _release(state: StateObjects) -> None:
    with _lock:
        state.count -= 1
        if state.count > 0:
            return
        if _registry.get(state.key) is state:
            del _registry[state.key]
    state.close()


# Set when the interpreter begins to exit: its main thread has ended (threading's exit
# hook, before it joins the other threads) or jaxbind's atexit hook ran.
_main_ended = threading.Event()


def mark_exit() -> None:
    """The interpreter's main thread has ended (see `exiting`)."""
    _main_ended.set()


def exiting() -> bool:
    """Whether the interpreter has begun to exit: its main thread has ended and so has
    every other thread it waits for (from then on atexit hooks run, JAX's among them,
    which frees executables, while daemon threads may still run programs), or it is
    finalizing. No teardown runs from then on (docs/state.md)."""
    if sys.is_finalizing():
        return True
    if not _main_ended.is_set():
        return False
    main = threading.main_thread()
    return not any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main)


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
        self.on_cpu: StateObjects | None = None  # the CPU's, once set up (the fast path)
        self.placed: dict[tuple, StateObjects] = {}  # place -> StateObjects, without a key
        self.keyed: collections.OrderedDict = collections.OrderedDict()  # key -> (copies, state)
        # (re-entrant: a key value's setup may call the program holding this site)
        self.mu = threading.RLock()
        if eager and not sdef.key:
            # (XLA instantiates the site: see StateObjects.first for why it does not wait)
            self.on_cpu = self.placed[()] = _acquire(self.base, sdef, arguments, label, True, False)

    def for_kernel(self, kernel) -> KernelState:
        """What a kernel site's trampoline holds of the state (KernelSite.state). The first
        object's address is checked now: a setup whose object gives none fails here, at
        instantiate, with the error naming the op. A numba kernel over ranges shares the
        call's object between its ranges: under "lock" and "pool" they run in order. A
        kernel for CUDA has a state per device, set up at the device's first call
        (`cell_for_device`)."""
        if kernel.platform == "cuda":
            try:  # (refused when the op is made: a keyed state, say)
                kernel.check_state(f"jaxbind: {self.label}", self.sdef)
            except TypeError as exc:
                raise SetupError(str(exc)) from None
            return KernelState(None, (), False, self, per_device=True)
        serial = kernel.ranges is not None and self.sdef.concurrency != "shared"
        if self.sdef.key:
            return KernelState(None, tuple(self.key_at), serial, self)
        state = self.state_for(())  # (set up now, if the site was not instantiated)
        if not state.pending:  # (else the cell asks at the first call)
            state.cell.set_address(0, state.provide(0, False))
        return KernelState(state.cell, (), serial, self)

    def cell_for_device(self, device: int, stream: int) -> object:
        """For a kernel for CUDA's first call on `device` (the trampoline asks, with the
        GIL, on the call's thread, the device's context current): the cell of the
        device's state, set up now, told the call's stream (jaxbind.current_call(), and a
        C state's ``jaxbind_setup``)."""
        with placed("cuda", stream, device):
            state = self.state_for((), ("cuda", device))
            if state.pending:
                state.first()
        state.cell.set_address(0, state.provide(0, False))
        return state.cell

    def cell_for(self, keys: tuple) -> object:
        """For a kernel's call with key inputs not seen (the trampoline asks, with the
        GIL): the cell of their state, set up if new. `keys`: the key inputs as
        ``(address, shape, XLA element type)``."""
        arrays = [_array(*key) for key in keys]
        state = self._keyed(arrays, ())
        state.cell.set_address(0, state.provide(0, False))  # (made: see _acquire)
        return state.cell

    def state_for(self, args, place: tuple = (), on_host=np.asarray) -> StateObjects:
        """The state for a call with inputs `args` at `place`, set up now if need be;
        `on_host` gives a key input's values as a NumPy array."""
        if self.sdef.key:
            return self._keyed([on_host(args[i]) for i in self.key_at], place)
        with self.mu:
            state = self.placed.get(place)
            if state is None:
                key = (*self.base, *place)
                state = _acquire(key, self.sdef, self.arguments, self.label, True, place=place)
                self.placed[place] = state
                if not place:
                    self.on_cpu = state
            return state

    def _keyed(self, inputs: list, place: tuple) -> StateObjects:
        with self.mu:
            for k, (copies, state) in self.keyed.items():
                if k[0] == place and all(_same(a, b) for a, b in zip(copies, inputs)):
                    self.keyed.move_to_end(k)
                    return state
            copies = [a.copy() for a in inputs]
            k = (place, *((a.dtype.str, a.shape, a.tobytes()) for a in copies))
            arguments = dict(self.arguments, **dict(zip(self.sdef.key, copies)))
            state = _acquire(
                (*self.base, *k), self.sdef, arguments, self.label, eager=True, place=place
            )
            self.keyed[k] = (copies, state)
            while len(self.keyed) > _ext.state_keys_kept:  # (as many as a kernel site's)
                _release(self.keyed.popitem(last=False)[1][1])
            return state

    def __del__(self):
        if exiting():
            return
        for state in self.placed.values():
            _release(state)
        for _, state in self.keyed.values():
            _release(state)


@dataclasses.dataclass(frozen=True, slots=True)
class KernelState:
    """What a kernel site's trampoline reads of its op's state, by name, once, when the
    site is made (cpp/site.h reads it into its C++ KernelState, cpp/state.h).

    Attributes:
      cell: the state's cell (``_ext.StateCell``) for a state without key, else None.
      key_inputs: for a state with key=, the key inputs' positions among the call's
        inputs; the site keeps the last few values' cells, by their bytes.
      serial_tasks: the kernel's ranges share the call's object: they run in order.
      lease: the site's `Lease`, held weakly by the trampoline, which asks its
        ``cell_for`` for a key value not seen, or ``cell_for_device`` for a device's.
      per_device: a kernel for CUDA's: a cell per device, from ``cell_for_device``.
    """

    cell: _ext.StateCell | None
    key_inputs: tuple[int, ...]
    serial_tasks: bool
    lease: Lease
    per_device: bool = False


def _array(address: int, shape: tuple, code: int) -> np.ndarray:
    """A read-only view of a buffer the trampoline describes (valid during the call)."""
    dtype = np.dtype(XLA_ELEMENT_TYPES[code])
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size == 0:
        return np.empty(shape, dtype)
    raw = (ctypes.c_char * size).from_address(address)
    view = np.frombuffer(memoryview(raw), dtype).reshape(shape)
    view.flags.writeable = False
    return view


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
        self.run((), np.asarray, out, args, kwargs_dump)

    def on_gpu(self, device: int, on_host, out, args, kwargs_dump) -> None:
        """A GPU call (from the GPU dispatcher): the state of its device; `on_host` copies
        a key input to the host."""
        self.run(("cuda", device), on_host, out, args, kwargs_dump)

    def run(self, place: tuple, on_host, out, args, kwargs_dump) -> None:
        """The body, with an object of the state at `place` current (taken under its
        policy)."""
        lease = self.lease
        for attempt in range(4):
            state = (None if place else lease.on_cpu) or lease.state_for(args, place, on_host)
            if state.pending:  # (left to the first call, or set up on another thread now)
                state.first()
            try:
                slot = state.use()
                break
            except RuntimeError:
                # a key value's state dropped from the lease's last few by another thread
                # meanwhile: set up again
                if not lease.sdef.key or not state.cell.closed or attempt == 3:
                    raise
        body = self.body if not _watchers else self._noting(state)
        stack, holding = _stack(), _holding()
        stack.append(state.slots[slot])
        holding.append(state)
        try:
            body(out, args, kwargs_dump)
        finally:
            stack.pop()
            holding.pop()
            state.give_back(slot)
            if state.deferred and state not in holding:
                state.deferred = False
                state.close()

    def _noting(self, state: StateObjects):
        """The body, telling each watcher which object it used, from when to when."""

        def noted(out, args, kwargs_dump):
            obj, start = _stack()[-1], time.perf_counter()
            try:
                self.body(out, args, kwargs_dump)
            finally:
                end = time.perf_counter()
                for w in _watchers:
                    w.used(state, obj, start, end)

        return noted
