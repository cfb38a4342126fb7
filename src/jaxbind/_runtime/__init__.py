"""Run time: the Python the trampoline (cpp/) calls while XLA runs a program.

Everything here runs inside a compiled program, called from C++ with the GIL held;
trace-time code (the registry, the rules, the lowering) never reaches into it.

- `sites`: call sites. From a call's attributes (at XLA's instantiate stage, or at a
  site's first call where XLA keeps no per-site slot): checked, the binding's body for
  its role found, its state set up; then each new buffer signature accepted (a
  kernel's address for it).
- `state`: the ops' states (``state=``): set up, shared between sites, freed with
  the executables that use them.
- `fits`: does the call still fit the op it names? The one ordered definition check,
  run on the attributes when a site is instantiated and on each new buffer signature.
- `report`: what a failing callable becomes, and views that outlived their call.
- `gpu`: a site's GPU plan (made once; the trampoline runs it per batch element),
  CUDA arrays, host mode.

`install` hands these to the trampoline, once, at import; `check_outputs` switches the
trampoline's check of unwritten outputs (JAXBIND_CHECK_OUTPUTS=1 at import).
"""

from __future__ import annotations

import atexit
import os
import threading

import jax

from .. import _ext
from .._avals import XLA_ELEMENT_TYPES
from .._callformat import FORMAT
from .._compat import collect_jax_garbage
from . import gpu, state
from .report import escaped_views, format_callback_error
from .sites import instantiate_site

__all__ = ["check_outputs", "install"]


def install() -> None:
    """Hand the trampoline its tables and callbacks (once, at import)."""
    assert _ext.call_format == FORMAT, "the extension and the Python package disagree"
    _ext.init(XLA_ELEMENT_TYPES, instantiate_site, format_callback_error, gpu.plan)
    _ext.set_view_hooks(collect_jax_garbage, escaped_views)
    _ext.set_check_outputs(os.environ.get("JAXBIND_CHECK_OUTPUTS", "0") not in ("", "0"))
    atexit.register(_shutdown)
    # The first sign of exit Python gives: its main thread has ended (threading calls
    # these hooks before it joins the non-daemon threads, and before any atexit hook).
    # Python's own, private (concurrent.futures uses it); 3.9 and later.
    register_exit = getattr(threading, "_register_atexit", None)
    try:
        if register_exit is not None:
            register_exit(state.mark_exit)
    except RuntimeError:  # imported while the interpreter exits
        state.mark_exit()


def check_outputs(on: bool = True) -> bool:
    """Check, from now on, that every CPU call of a jaxbind op (kernel or Python callable)
    writes every element of its outputs; ``check_outputs(False)`` stops. Returns the
    setting before, so that ``previous = check_outputs(); ...; check_outputs(previous)``
    restores it. Setting ``JAXBIND_CHECK_OUTPUTS=1`` in the environment turns it on at
    import.

    A debugging aid, off by default: before each call, jaxbind fills the outputs with
    NaN (floats, complex numbers) or the bytes 0xA5 (integers, bools), and an element
    that still holds that value after the call, in any part (the real or the imaginary
    half of a complex number), fails the call with an error that names the op and the
    output. The NaN has a payload that arithmetic does not make: a computed NaN passes.
    Outputs that share an input's memory (``input_output_aliases``) are not checked,
    nor GPU calls. Off, it costs nothing measurable; on, about a pass over the outputs
    before and after each call.
    """
    if not isinstance(on, bool):
        raise TypeError(f"jaxbind.check_outputs takes True or False, not {on!r}")
    return _ext.set_check_outputs(on)


def _shutdown() -> None:
    """At interpreter exit: programs with effects that were dispatched and not waited for
    run first (JAX waits for them at exit too, but later: atexit runs jaxbind's hook
    before JAX's, which was registered first); then handlers stop calling Python, and
    no state is torn down (JAX's hook, next, frees the executables)."""
    state.mark_exit()
    try:
        jax.effects_barrier()
    except Exception:  # a failed program has reported its own error
        pass
    _ext.shutdown()
