"""C states: an op's state whose setup and teardown are C functions (`c_state`), so that a
bundle (jaxbind.bundle) carries it to a PJRT host without Python, whose runtime
(cpp/runtime/) calls the same functions. In Python the state is an ordinary
`jaxbind.state`: its setup calls the C setup with the op's keyword arguments in the ABI's
form (``jaxbind_setup`` of ``jaxbind/kernel.h``), and its object is the address the setup
gives, which a kernel gets as ``call->state``."""

from __future__ import annotations

import ctypes
import inspect
from dataclasses import dataclass
from typing import Any

from .._state import StateDef, setup_place, state
from . import abi

__all__ = ["CStateDef", "NativeState", "c_state"]

_SETUP = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
_TEARDOWN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@dataclass(frozen=True)
class NativeState:
    """A C state's functions: their addresses, and where a host finds them (the shared
    library, an absolute path, and the exported symbol; see Kernel.library_function)."""

    setup: int
    teardown: int | None
    setup_symbol: tuple[str, str] | None
    teardown_symbol: tuple[str, str] | None
    keep: tuple = ()


@dataclass(frozen=True, eq=False)
class CStateDef(StateDef):
    """A `StateDef` whose setup and teardown are C functions (`native`)."""

    native: NativeState | None = None


def c_state(
    setup: Any,
    teardown: Any = None,
    *,
    params: tuple[str, ...] | list[str] | None = None,
    concurrency: str = "lock",
    pool_size: int | None = None,
    name: str | None = None,
) -> CStateDef:
    """Declare an op's state made by C functions (see ``jaxbind_setup`` in
    ``jaxbind/kernel.h``), for ops whose bodies are C kernels: the op runs in Python as
    with any `jaxbind.state`, and in a bundle (`jaxbind.bundle`) on a PJRT host without
    Python, whose runtime calls the same functions.

    Args:
      setup: ``int32_t setup(const jaxbind_setup *args, void **state)``: a ctypes or cffi
        function pointer, or an address. It gets the op's static keyword arguments it
        takes (`params`), sorted by name, and stores the object's address in ``*state``;
        it returns 0, or writes a message into ``args->error`` and returns nonzero (the
        compilation, or the call, then fails naming the op).
      teardown: ``void teardown(void *state)`` (same forms), or None.
      params: the keyword arguments the setup takes (default: every one the call gives).
      concurrency, pool_size: as `jaxbind.state`.
      name: what messages call it (default: the setup's symbol).

    Returns:
      The state, for an op's ``state=``. (No ``key=``: a key's inputs are traced arrays,
      which a C setup does not take.)
    """
    from . import _address_of, _pin_library, library_function

    setup_address = setup if isinstance(setup, int) else _address_of(setup)
    if not setup_address:
        raise TypeError(
            f"jaxbind.c_state: the setup must be a ctypes or cffi function pointer, or an "
            f"address, got {setup!r}"
        )
    teardown_address = None
    if teardown is not None:
        teardown_address = teardown if isinstance(teardown, int) else _address_of(teardown)
        if not teardown_address:
            raise TypeError(
                f"jaxbind.c_state: the teardown must be a ctypes or cffi function pointer, an "
                f"address or None, got {teardown!r}"
            )
    setup_symbol = library_function(setup_address)
    teardown_symbol = library_function(teardown_address) if teardown_address else None
    label = name or (setup_symbol[1] if setup_symbol else f"setup at {setup_address:#x}")
    call_setup = _SETUP(setup_address)
    call_teardown = _TEARDOWN(teardown_address) if teardown_address else None

    def run_setup(**kwargs: Any) -> int:
        where = f"jaxbind.c_state {label!r}"
        place = setup_place()  # (a kernel for CUDA's state: the device it is set up for)
        typed = [abi.typed_kwarg(k, kwargs[k], where) for k in sorted(kwargs)]
        keep: list = []
        words = abi.pack_kwargs(typed, keep)
        error = ctypes.create_string_buffer(1024)
        args = abi.SETUP.pack(
            [
                {
                    "abi_version": abi.ABI_VERSION,
                    "n_kwargs": len(typed),
                    "kwargs": words.ctypes.data,
                    "error": ctypes.addressof(error),
                    "error_size": len(error),
                    "platform": abi.PLATFORMS[place[0] if place else "cpu"],
                    "stream": place[1] if place else 0,
                    "device": place[2] if place else -1,
                }
            ]
        )
        out = ctypes.c_void_p(0)
        status = call_setup(args.ctypes.data, ctypes.byref(out))
        if status != 0:
            why = error.value.decode(errors="replace") or f"it returned status {status}"
            raise RuntimeError(f"{where} failed: {why}")
        if not out.value:
            raise RuntimeError(f"{where} returned success but no object (NULL)")
        return int(out.value)

    run_setup.__name__ = run_setup.__qualname__ = label
    if params is None:
        parameters = [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    else:
        parameters = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY) for p in params]
    run_setup.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]

    def run_teardown(obj: int) -> None:
        if call_teardown is not None:
            call_teardown(obj)

    declared = state(concurrency=concurrency, pool_size=pool_size, teardown=run_teardown)(run_setup)
    keep: tuple = (setup, teardown, call_setup, call_teardown, _pin_library(setup_address))
    if teardown_address:
        keep += (_pin_library(teardown_address),)
    native = NativeState(setup_address, teardown_address, setup_symbol, teardown_symbol, keep)
    fields = {f: getattr(declared, f) for f in StateDef.__dataclass_fields__}
    return CStateDef(**fields, native=native)
