"""What runs a call on a platform: the one answer, `runs`, read from the table of body kinds.

Every call of a role is computed by one of four rows:

- **native**: the role's own body (`Body`). A kind that runs itself on the platform
  (``Body.platforms``) is the trampoline's custom call, of the target table's rows for its
  ``calls`` (_rules.targets.pick); a traced kind (a JAX function, a role derived from the
  reference) is inlined into the program, on any platform;
- **reference**: the op's JAX reference inlined instead (the target table's reference
  row), where the op has one and the body does not run on the platform, the op prefers
  its reference there (its `Reference`'s platforms, ``prefer_reference=``) or the switch
  asks for references (jaxbind.use_reference, ``portable=True``);
- **hosted**: a call with side effects in a program that Shardy splits over several
  devices, run once by JAX's host callback (on the CPU only);
- **refused**: none of these can compute it; the answer carries the error that names the
  op and the fix.

Registration (a `Reference`'s platforms, the rules' lowering platforms: `NATIVE_PLATFORMS`),
the lowering, jaxbind.testing.check and docs/portable.md's table
(tests/references/test_what_runs_where.py) all ask `runs`. It runs at trace time only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._errors import about, words
from ._roles import NATIVE_PLATFORMS, Body, Role

__all__ = ["HOSTED_PLATFORMS", "NATIVE_PLATFORMS", "Runs", "lowering_platform", "runs"]

# Where a call with side effects in a program Shardy splits runs, by JAX's host callback
HOSTED_PLATFORMS = ("cpu",)


@dataclass(frozen=True, slots=True)
class Runs:
    """What runs one call of a role on one platform.

    Attributes:
      row: "native", "reference", "hosted" or "refused".
      kind: the kind of the role's body (its row of `Body`).
      body_runs_here: whether that body runs itself on the platform (a traced one: always),
        whatever computes the call (jaxbind.testing calls it directly where it does).
      why: for "reference" and "refused", the reason: "switch" (use_reference), "strict"
        (references only), "bundle" (jaxbind.bundle: the body cannot run without Python),
        "preferred" (the reference's platforms name the platform), "elsewhere" (the body
        does not run on the platform) or "hosted" (a hosted call on a platform without a
        host callback); "" for the others.
      error: for "refused", the error to raise (`refusal`).
    """

    row: str
    kind: Body
    body_runs_here: bool
    why: str = ""
    error: Exception | None = None

    def refusal(self) -> None:
        """Raise the refusal's error (nothing for the other rows)."""
        if self.error is not None:
            raise self.error


def runs(
    binding: Any,
    role: str | Role,
    platform: str,
    *,
    switch: str = "off",
    spread: bool = False,
    hosted: bool = False,
) -> Runs:
    """What computes a call of `binding`'s `role` in a program lowered for `platform` (as
    JAX's lowering names it: "cpu", "cuda", "tpu", ...).

    `switch`: the use_reference setting ("off", "on" or "strict"); `spread`: the call has
    side effects and Shardy splits its program over several devices; `hosted`: the call
    is the one a host callback runs (always native)."""
    entry = binding.role(role)
    kind = entry.kind
    if hosted or kind.traced:
        return Runs("native", kind, True)
    options = binding.options
    here = platform in kind.platforms
    if switch == "bundle":  # jaxbind.bundle: what a host without Python can run
        why = not_carried(binding, entry)
        if why is None:
            switch = "off"
        elif entry.reference is not None:
            return Runs("reference", kind, here, "bundle")
        else:
            return _refused(
                kind,
                here,
                "bundle",
                TypeError(
                    f"{about(binding.name, entry.role.text)} cannot go into a bundle, which "
                    f"runs without Python: {why}. Give it a reference "
                    f"({words(options).give_reference()}), or a compiled body (a C kernel: "
                    "jaxbind.kernel of a function in a shared library, built against "
                    "jaxbind/kernel.h; see docs/without-python.md)"
                ),
            )
    if entry.reference is None:
        if switch == "strict":
            return _refused(
                kind,
                here,
                "strict",
                TypeError(
                    f"{about(binding.name)} has no JAX reference, and references only were "
                    "asked for (jaxbind.export(..., portable=True), use_reference(strict=True) "
                    "or JAXBIND_USE_REFERENCE=strict): a program without custom calls cannot "
                    "contain it. Give the op a reference "
                    f"({words(options).give_reference()}: a JAX function of its arrays "
                    "and keyword arguments that returns its outputs)"
                ),
            )
        if not here:  # TPU, ROCm, plugins; a CUDA kernel on the CPU
            runs_on = " and ".join(kind.platforms)
            return _refused(
                kind,
                here,
                "elsewhere",
                NotImplementedError(
                    f"{about(binding.name)} cannot be lowered for {platform}: its body runs on "
                    f"{runs_on} only, and it has no JAX reference to run elsewhere. "
                    f"Give it one ({words(options).give_reference()}: a JAX function of "
                    "its arrays and keyword arguments that returns its outputs), or lower for "
                    f"{runs_on} only"
                ),
            )
    elif switch != "off":
        return Runs("reference", kind, here, "strict" if switch == "strict" else "switch")
    elif platform in entry.reference.value.platforms:
        return Runs("reference", kind, here, "preferred")
    elif not here:
        return Runs("reference", kind, here, "elsewhere")
    if spread and options.effect is not None:
        if platform not in HOSTED_PLATFORMS:
            return _refused(
                kind,
                here,
                "hosted",
                TypeError(
                    f"{about(binding.name)} has side effects "
                    f"({'ordered=True' if options.effect == 'ordered' else 'has_side_effect=True'})"
                    " and is called in a GPU program that Shardy partitions over several "
                    "devices; jaxbind runs such calls once, on one device, on CPU only. Call "
                    "it inside jax.shard_map (once per shard), outside the sharded program, or "
                    "with jax_use_shardy_partitioner=False"
                ),
            )
        return Runs("hosted", kind, here)
    return Runs("native", kind, here)


def not_carried(binding: Any, entry: Any) -> str | None:
    """Why a bundle (jaxbind.bundle: a program for a PJRT host without Python) cannot
    carry the native body of `entry`, a role of `binding`; None if it can: a C kernel (a
    function in a shared library, `Kernel.library_function`) of an op without a state, or
    with a C state (jaxbind.c_state)."""
    body = entry.body
    if entry.kind is not Body.KERNEL:
        what = {
            Body.CUDA_KERNEL: "a CUDA kernel",
            Body.STREAM_KERNEL: "a kernel for CUDA (the C runtime runs CPU programs)",
            Body.GRAPH_SAFE_KERNEL: "a kernel for CUDA (the C runtime runs CPU programs)",
        }.get(entry.kind, "a Python callable")
        return f"its body is {what}"
    if body.library_function() is None:
        if body.origin == "numba function":
            return (
                f"its body is the numba kernel {body.name}, which numba "
                "compiles in this process only (numba's ahead-of-time compiler, numba.pycc, is "
                "deprecated and makes Python modules)"
            )
        return (
            f"its body is the kernel {body.name}, which is in no shared "
            "library that a host could load by name"
        )
    state = binding.options.state
    if state is not None and getattr(state, "native", None) is None:
        return (
            f"its state {state.name!r} is set up by a Python function; make it with "
            "jaxbind.c_state (a C setup and teardown)"
        )
    return None


def _refused(kind: Body, here: bool, why: str, error: Exception) -> Runs:
    return Runs("refused", kind, here, why, error)


def lowering_platform(backend: str) -> str:
    """JAX's backend name (jax.default_backend()) as the lowering names its platform."""
    return "cuda" if backend == "gpu" else backend
