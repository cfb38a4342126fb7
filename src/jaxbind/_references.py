"""When an op's JAX reference computes it instead of its native body: the switch.

An op may have a JAX reference (``reference=`` in both APIs, ``op.def_reference``): a
function of JAX arrays that computes what its body computes. Every call lowers either
to the native body (the trampoline's custom call, on CPU and CUDA) or to the reference,
inlined as JAX code (_rules.reference). Which one is decided when a program is lowered,
call by call, from three things:

- the platform: where the op has no body (any platform but CPU and CUDA: TPU, ROCm,
  Metal, a PJRT plugin), the reference, always;
- the op's ``prefer_reference=`` platforms (e.g. ``("cuda",)`` for an op whose CPU
  library would run in host mode on a GPU);
- the switch here, `use_reference`: off (the native body wherever it runs), on (the
  reference wherever the op has one), or strict (the reference everywhere, and an op
  without one is refused: `jaxbind.export(..., portable=True)` lowers so).

The switch is a JAX configuration state in every jit's cache key, as jax_enable_x64
is: a program traced under one setting is never reused under another. (jax 0.7 caches
traces by a fixed list of its own states: there, entering and leaving the switch clear
JAX's caches.) The environment
variable ``JAXBIND_USE_REFERENCE`` sets it for a process ("1": on; "strict"); it is the
only one read (the state is not a JAX option, whose name JAX would read as another).
Entered inside a traced function, the switch would change nothing (the calls are lowered
after the trace): there it raises.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import jax

from ._compat import STATES_KEY_TRACES, define_jit_keyed_state, tracing

__all__ = ["MODES", "bundling", "mode", "use_reference"]

# off: native bodies where they run; on: references where ops have them; strict: the
# reference of every op (none may lack one); bundle: native bodies that a bundle carries
# to a host without Python (C kernels), the reference of every other op (jaxbind.bundle)
MODES = ("off", "on", "strict", "bundle")


def _from_environment() -> str:
    value = os.environ.get("JAXBIND_USE_REFERENCE", "").strip().lower()
    if value in ("", "0", "off", "false", "no"):
        return "off"
    if value in ("1", "on", "true", "yes"):
        return "on"
    if value == "strict":
        return "strict"
    raise ValueError(
        f"jaxbind: JAXBIND_USE_REFERENCE={value!r} is not a setting; use 1 (run ops' JAX "
        "references where they have one), strict (run every op's reference; an op "
        "without one is an error) or 0 (native bodies)"
    )


# (the state's name is not a JAX option and makes JAX read no environment variable: the
# one variable is JAXBIND_USE_REFERENCE, read above)
_STATE = define_jit_keyed_state(
    "jaxbind_use_reference",
    MODES,
    _from_environment(),
    "Which body computes jaxbind ops: 'off' (native bodies where they run), 'on' (JAX "
    "references where ops have them), 'strict' (references only), 'bundle' (C kernels, "
    "else references)",
)


def mode() -> str:
    """The switch's setting now: "off", "on" or "strict"."""
    return _STATE.value


@contextlib.contextmanager
def use_reference(enabled: bool = True, *, strict: bool = False) -> Iterator[None]:
    """Run ops' JAX references instead of their native bodies, inside the block.

    Programs traced inside the block (jit, grad, eager calls, export) lower every op
    that has a reference (``reference=``) to it, on every platform, so they run where
    the native library is missing, and their results can be compared with the native
    ones. Ops without a reference keep their native body, unless ``strict=True``,
    which refuses them (naming the op): a program traced so contains no custom call.
    ``enabled=False`` turns the switch off inside the block. Programs traced outside
    are not affected; the setting is part of jit's cache key. Enter it around a call of a
    transformed function, not inside the function: entered while JAX traces (jit, grad,
    vmap), where the setting would change, it raises. The environment variable
    ``JAXBIND_USE_REFERENCE`` (1 or strict) turns it on for a whole process.

    Example:
      >>> with jaxbind.use_reference():  # doctest: +SKIP
      ...     y = jax.jit(f)(x)           # f's ops run as their JAX references
    """
    if not isinstance(enabled, bool) or not isinstance(strict, bool):
        raise TypeError(
            f"jaxbind.use_reference: enabled and strict must be bools, got {enabled!r}, {strict!r}"
        )
    setting = ("strict" if strict else "on") if enabled else "off"
    if setting == mode():
        yield
        return
    if tracing():  # the calls traced here are lowered after the trace, outside the block
        raise RuntimeError(
            f"jaxbind.use_reference({_spelled(enabled, strict)}) was entered inside a "
            "function that JAX is tracing (under jit, grad, vmap, eval_shape or export), "
            "where it would be ignored: which body runs is decided when the traced program "
            "is lowered, after the block has closed. Enter it outside, around the call of "
            f"the transformed function: with jaxbind.use_reference({_spelled(enabled, strict)})"
            ": y = jax.jit(f)(x)"
        )
    if not STATES_KEY_TRACES:  # jax 0.7: programs traced under the other setting go
        _clear_jax_caches()
    try:
        with _STATE(setting):
            yield
    finally:
        if not STATES_KEY_TRACES:
            _clear_jax_caches()


@contextlib.contextmanager
def bundling() -> Iterator[None]:
    """The switch as jaxbind.bundle lowers (outside any trace): C kernels stay native, every
    other body computes by its reference (jaxbind._where.runs)."""
    if not STATES_KEY_TRACES:
        _clear_jax_caches()
    try:
        with _STATE("bundle"):
            yield
    finally:
        if not STATES_KEY_TRACES:
            _clear_jax_caches()


def _spelled(enabled: bool, strict: bool) -> str:
    return "strict=True" if enabled and strict else "" if enabled else "False"


def _clear_jax_caches() -> None:
    """jax 0.7: JAX's caches cleared, after the programs in flight have finished (a program
    dispatched before, still running, keeps what its call sites need until it is done)."""
    jax.block_until_ready(jax.live_arrays())
    jax.clear_caches()
