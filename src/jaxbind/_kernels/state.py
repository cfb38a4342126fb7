"""What a kernel gets of its op's state (kernel ABI version 3, ``jaxbind_call.state``):
the address of the object the state's setup returned.

The object stays a Python object, owned by the state (its teardown frees it); a kernel
gets its address, which the object gives in one of these ways: it is an int (a C
library's handle, e.g. a plan pointer), a ctypes pointer, ``c_void_p``, structure or
array, a cffi pointer, a C-contiguous NumPy array (its data), or any object with a
``jaxbind_address`` attribute (an int, or a method that returns one).
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["ADDRESS_ATTRIBUTE", "state_address"]

ADDRESS_ATTRIBUTE = "jaxbind_address"


def state_address(obj, label: str, state: str | None) -> int:
    """The address a kernel gets for the object `obj` of the state whose setup is named
    `state` (None: unknown), at the op and role `label`; a TypeError naming them and the
    fix if it gives none."""
    address = _address(obj)
    setup = "its state's setup" if state is None else f"the setup {state!r}"
    if isinstance(address, str):
        raise TypeError(
            f"jaxbind: {label}: its body is a compiled kernel, which gets the address of its "
            f"state's object, but {setup} returned {address}. Return an int "
            "(a handle or pointer), a ctypes or cffi pointer, a C-contiguous NumPy array, or "
            f"an object with a {ADDRESS_ATTRIBUTE!r} attribute or method that gives one "
            "(keep the Python objects the address points into alive in it)"
        )
    if not 0 < address < 2**64:
        raise ValueError(
            f"jaxbind: {label}: {setup} gave the address {address:#x}"
            f", {'a NULL pointer' if address == 0 else 'out of range'}; a kernel would "
            "dereference it. Return the object's address (did a C setup fail?)"
        )
    return address


def _address(obj) -> int | str:
    """The object's address, or what it is, for the message."""
    if obj is None:
        return "None"
    if isinstance(obj, (bool, np.bool_)):
        return f"a bool ({obj!r})"
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, ctypes.c_void_p):
        return obj.value or 0
    if isinstance(obj, ctypes._Pointer):
        return ctypes.cast(obj, ctypes.c_void_p).value or 0
    if isinstance(obj, (ctypes.Structure, ctypes.Union, ctypes.Array)):
        return ctypes.addressof(obj)
    if type(obj).__module__ == "_cffi_backend":
        import cffi

        ffi = cffi.FFI()
        try:
            kind = ffi.typeof(obj).kind
        except TypeError:
            kind = None
        if kind in ("pointer", "array"):
            return int(ffi.cast("uintptr_t", obj))
        return f"a cffi {kind or type(obj).__name__} object, not a pointer"
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            return "a NumPy array that is not C-contiguous (np.ascontiguousarray makes one)"
        return int(obj.ctypes.data)
    attribute = getattr(obj, ADDRESS_ATTRIBUTE, None)
    if attribute is not None:
        value = attribute() if callable(attribute) else attribute
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        return f"an object whose {ADDRESS_ATTRIBUTE} gave {value!r}, not an int"
    return f"a {type(obj).__module__}.{type(obj).__qualname__} object"
