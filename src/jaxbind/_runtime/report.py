"""What the user is told when a body misbehaves at run time: the error a failing
callable becomes, and the views of a call that outlived it (see cpp/views.h).
"""

from __future__ import annotations

import gc
import traceback
import warnings

import jax
import numpy as np

from .. import _ext
from .._errors import callback_hint

__all__ = ["escaped_views", "format_callback_error", "user_traceback"]


def escaped_views(label, moved, outs, ins) -> None:
    """Views of a call outlived it and now hold their own copies (see cpp/views.h).

    `moved` lists ``(address, nbytes, view, holders)``: the XLA memory each view
    pointed at, and how many references other than its tuple's it had. What holds a
    view itself is fine now. What took the memory from it during the call is not:

    - arrays derived from a view (slices, reshapes, ``.T``, ``.real``) point into
      XLA's memory too. Those the garbage collector can reach are moved into the view's
      copy, read-only;
    - a memoryview of a view is released (using it raises, rather than reading
      reused memory);
    - JAX arrays made from a view (``jax.device_put`` / ``jnp.asarray`` alias NumPy
      memory on the CPU), and holders outside Python, cannot be moved: they are named
      in a warning.

    Costs nothing unless a callable kept something: then one pass over the garbage
    collector's referrers, and a pass over its objects if a view has holders that the
    first cannot explain.
    """
    views = [entry[2] for entry in moved]
    ours = {id(outs), id(ins), id(moved), id(views)} | {id(entry) for entry in moved}
    # Output memory is XLA's alone during the call: a JAX array sharing it was made in
    # the callable. (Input memory may be the caller's own array: see below.)
    outputs = [e for e in moved if any(e[2] is v for v in outs)]
    for start, nbytes, _, _ in outputs:
        text = _aliased(label, start, nbytes)
        if text is not None:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
            return
    held = {id(v): 0 for v in views}
    mine = {id(v) for v in views}
    for referrer in gc.get_referrers(*views):
        # a memoryview's buffer holds the view's memory, not just the view; a tuple of
        # nothing but views may be the call's own (some Pythons copy it): when unsure,
        # count no holder, which costs a scan, never a missed array
        if (
            id(referrer) in ours
            or type(referrer).__name__ == "managedbuffer"
            or (type(referrer) is tuple and all(id(x) in mine for x in referrer))
        ):
            continue
        for item in gc.get_referents(referrer):
            if id(item) in held:
                held[id(item)] += 1
    unexplained = {id(e[2]): e for e in moved if e[3] > held[id(e[2])]}
    if not unexplained:
        return
    derived = _move_derived(unexplained, ours)
    for key, (start, nbytes, _view, holders) in unexplained.items():
        if holders <= held[key] + derived.get(key, 0):
            continue
        warnings.warn(_held_elsewhere(label, start, nbytes), RuntimeWarning, stacklevel=2)
        return


def _move_derived(escaped, ours) -> dict:
    """Move arrays derived from the escaped views into their copies. Counts, per view,
    the derived arrays and memoryviews, and the objects that hold the view itself."""
    found: dict[int, int] = {}  # by the id of the view
    seen: set[int] = set()
    for obj in gc.get_objects():
        if id(obj) in ours:
            continue
        for item in gc.get_referents(obj):
            if id(item) in escaped:  # the view itself (a tuple the first pass skipped)
                found[id(item)] = found.get(id(item), 0) + 1
                continue
            if id(item) in seen:
                continue
            # by type(), which never dereferences: a dead weakref.proxy among the referents
            # raises ReferenceError on isinstance()
            kind = type(item)
            if issubclass(kind, np.ndarray):
                base = item.base
                entry = escaped.get(id(base)) if base is not None else None
                if entry is None or item is entry[2]:
                    continue
                seen.add(id(item))
                start, nbytes, view, _ = entry
                if _ext.move_view(item, start, nbytes, view.ctypes.data):
                    found[id(base)] = found.get(id(base), 0) + 1
            elif kind is memoryview and id(_exporter(item)) in escaped:
                seen.add(id(item))
                found[id(item.obj)] = found.get(id(item.obj), 0) + 1
                try:
                    item.release()
                except (BufferError, ValueError):
                    pass
    return found


def _exporter(view: memoryview):
    try:
        return view.obj
    except ValueError:  # released already
        return None


def _held_elsewhere(label, start, nbytes) -> str:
    text = _aliased(label, start, nbytes)
    if text is not None:
        return text
    return (
        f"jaxbind: the callable of {label} let something outside Python (a C "
        "extension, a raw pointer) keep the memory of one of its input or output arrays. "
        "That memory is XLA's and is reused after the call; copy what you need to keep "
        "(np.array(view))"
    )


def _aliased(label, start, nbytes) -> str | None:
    """The warning for a live JAX array that shares [start, start + nbytes), if any."""
    try:
        arrays = jax.live_arrays("cpu")
    except Exception:  # no CPU backend
        arrays = []
    for array in arrays:
        try:
            address = array.unsafe_buffer_pointer()
        except Exception:  # deleted, or not on one device
            continue
        if start <= address < start + max(nbytes, 1):
            return (
                f"jaxbind: the callable of {label} made a JAX array ({array.dtype}"
                f"{list(array.shape)}) that shares memory with one of its input or output "
                "arrays (jax.device_put or jnp.asarray of a view does not copy on the "
                "CPU). That memory is XLA's and is reused after the call, so the JAX "
                "array will read other data. Copy instead: jnp.array(view, copy=True), "
                "or np.array(view) first"
            )
    return None


def format_callback_error(label, etype, value, tb) -> str:
    """Text of the error XLA raises when a callable fails."""
    if isinstance(value, _ext.ReentrantUse) or getattr(value, "reported", False):
        return str(value)  # a message that says it all (see _runtime.state)
    name = getattr(etype, "__name__", str(etype))
    lines = traceback.format_exception(etype, value, tb)
    text = f"{value}"
    if isinstance(value, RecursionError) and text.startswith("Recursively calling jit"):
        text = text.split("\n", 1)[0] + "\n" + _REENTERED_JIT
    hint = callback_hint(value)  # the usual cause of such an error, where one is known
    text += f"\n{hint}" if hint else ""
    return (
        f"jaxbind: {label} raised {name}: {text}\n"
        "Traceback of the callable (most recent call last):\n" + "".join(lines[1:])
    )


def user_traceback(exc: BaseException, what: str) -> str:
    """The traceback of an error that user code (`what`: "the setup") raised, caught by
    jaxbind in the frame where the traceback starts (left out), as a message's last lines:
    the user's file and line survive where only the message travels (XLA's errors)."""
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
    lines = traceback.format_exception(type(exc), exc, tb)
    return f"Traceback of {what} (most recent call last):\n" + "".join(lines[1:]).rstrip("\n")


_REENTERED_JIT = (
    "The callable called a jitted function whose first call with these argument types is "
    "the one now running the callable. JAX refuses that on the same thread (and waits "
    "forever on another one, as it does for jax.pure_callback): the program is not ready "
    "until that first call returns. Call the jitted function once before (outside the "
    "callable), or call the jaxbind op itself eagerly, which jaxbind allows to recurse."
)
