"""The call format: how a program names one jaxbind call, written by the lowering and
read by the runtime. The trampoline (cpp/callformat.h) reads only the header every call
starts with, its format and site digest; what the attributes mean, and every check of
them, is here (`CallAttributes`).

A compiled or exported program names its jaxbind calls by these FFI attributes
(call format 4; the trampoline checks ``jaxbind_format`` first):

- ``jaxbind_format`` (int32): the format version, 4. Format 1 to 3 programs still run.
- ``binding`` (str): the binding's name; the process must have created it.
- ``role`` (str): which of the binding's callables, see `jaxbind._roles.Role`.
- ``kwargs`` (uint8 array): the keyword arguments the callables receive, encoded
  (see _kwargs); for a vectorized call they include ``batch_axes``.
- ``loop_levels`` (int32) and ``loop_batched`` (one uint8 flag per input):
  jaxbind's own batch loop, see `Loop` (format 1 kept it inside ``kwargs``).
- ``n_fixed`` (int32): the role's leading arguments that are not linear or
  differentiated, which the runtime needs to evaluate the abstract function.
- ``trees`` (uint8 array, format 3): the pytree structure of a pytree-API op's call
  (its arguments' and its results'), encoded as the keyword arguments are; empty for
  calls without one. (Format 2 carried it among the keyword arguments, as
  ``jaxbind_in`` and ``jaxbind_out``.)
- ``definition`` (str, format 4): the op's definition the program was made for, as
  JSON (see _definition): compared with the op the program finds before any body runs.
  Programs of formats 1 to 3 carry none; they are checked by their other attributes.
- ``site`` (int64): a digest of all of the above. It names the call site in the
  trampoline's cache; it detects accidents, not tampering, so the runtime checks
  every attribute and the buffers themselves when it first sees a site.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = ["FORMAT", "CallAttributes", "Loop", "NO_LOOP"]

FORMAT = 4
# batch levels of jaxbind's own loop: the trampoline's Loop::kMaxLevels (cpp/call.h; the
# two agree: tests/runtime/test_trampoline.py)
MAX_LEVELS = 64
MAX_FIXED = 4096


class Loop(NamedTuple):
    """jaxbind's own batch loop over one call (see _rules.batching.batch_looped).

    The leading ``levels`` axes of every output, and of each input whose flag in
    ``batched`` is set, form the batch; the callable is called once per batch
    element. ``levels == 0``: no loop, one plain call.
    """

    levels: int
    batched: tuple[bool, ...]

    def flags(self, n_inputs: int) -> bytes:
        """The ``loop_batched`` attribute: one byte per input."""
        flags = self.batched if self.levels else (False,) * n_inputs
        return bytes(int(b) for b in flags)


NO_LOOP = Loop(0, ())


@dataclass(frozen=True, slots=True)
class CallAttributes:
    """The attributes of one jaxbind call, in the format it was written in.

    ``levels``, ``flags`` and ``n_fixed`` are None in format 1, whose loop is inside
    the keyword arguments (_runtime/old_formats reads formats 1 and 2 in this format's
    terms); ``trees`` is empty before format 3, ``definition`` before
    format 4.
    """

    binding: str
    role: str
    kwargs: bytes
    levels: int | None = 0
    flags: bytes = b""
    n_fixed: int | None = 0
    trees: bytes = b""
    definition: str = ""
    format: int = FORMAT

    @classmethod
    def of_call(
        cls,
        binding: str,
        role: str,
        kwargs: bytes,
        loop: Loop,
        n_inputs: int,
        n_fixed: int,
        trees: bytes = b"",
        *,
        definition: str,
    ) -> CallAttributes:
        """The attributes the lowering writes for one call (this format, whose
        `definition` record is never empty: see `read`)."""
        if not definition:
            raise ValueError(f"jaxbind: a call of '{binding}' needs its definition record")
        return cls(
            binding, role, kwargs, loop.levels, loop.flags(n_inputs), n_fixed, trees, definition
        )

    @classmethod
    def read(cls, found: dict[str, Any]) -> CallAttributes:
        """The attributes of a call as the trampoline found them in a program, by their
        names there (those of the call's format that it found with the right type),
        checked: every attribute of the format present, the loop and n_fixed in range,
        and the digest (``site``) matching."""
        fmt = found["jaxbind_format"]
        if not all(name in found for name in ("binding", "role", "kwargs")):
            raise ValueError(
                "custom call lacks one of the attributes 'site', 'binding', 'role', 'kwargs' "
                "that call format 1 requires"
            )
        binding, role, kwargs = found["binding"], found["role"], found["kwargs"]
        if fmt == 1:
            attributes = cls(binding, role, kwargs, None, b"", None, format=1)
        else:
            if not all(name in found for name in ("loop_levels", "loop_batched", "n_fixed")):
                raise ValueError(
                    "custom call lacks one of the attributes 'loop_levels', 'loop_batched', "
                    "'n_fixed' that call format 2 requires"
                )
            if fmt >= 3 and "trees" not in found:
                raise ValueError(
                    "custom call lacks the attribute 'trees' that call format 3 requires"
                )
            levels, flags, n_fixed = found["loop_levels"], found["loop_batched"], found["n_fixed"]
            trees = found.get("trees", b"")
            if not 0 <= levels <= MAX_LEVELS:
                raise ValueError(f"the call's batch levels ({levels}) are out of range")
            if any(b > 1 for b in flags):
                raise ValueError("the call's batch flags are not 0 or 1")
            if not 0 <= n_fixed <= MAX_FIXED:
                raise ValueError(f"the call's n_fixed ({n_fixed}) is out of range")
            if fmt < 3 and trees:
                raise ValueError(f"call format {fmt} has no pytree structure attribute")
            definition = found.get("definition", "")
            if fmt >= 4 and "definition" not in found:
                raise ValueError(
                    "custom call lacks the attribute 'definition' that call format 4 requires"
                )
            if fmt >= 4 and not definition:
                raise ValueError(
                    "custom call has an empty 'definition' attribute, but call format 4 "
                    "requires the record of the op's definition the program was made for "
                    "(the program was modified or corrupted): export it again"
                )
            if fmt < 4 and definition:
                raise ValueError(f"call format {fmt} has no definition attribute")
            attributes = cls(
                binding,
                role,
                kwargs,
                levels,
                bytes(flags),
                n_fixed,
                bytes(trees),
                definition,
                format=fmt,
            )
        if attributes.digest != found["site"]:
            raise ValueError(
                f"the call attributes of '{binding}' are inconsistent (digest mismatch); "
                "the program was modified or corrupted"
            )
        return attributes

    @property
    def loop(self) -> Loop:
        """jaxbind's own batch loop (NO_LOOP for format 1 before `upgraded`)."""
        if not self.levels:
            return NO_LOOP
        return Loop(self.levels, tuple(bool(b) for b in self.flags))

    @property
    def digest(self) -> int:
        """Signed 64-bit digest of the attributes: the ``site`` attribute.

        Format 1 digests cover (binding, role, kwargs); format 2 digests also cover
        ``loop_levels``, ``loop_batched`` and ``n_fixed``; format 3, ``trees``.
        """
        h = hashlib.blake2b(digest_size=8)
        parts = [self.binding.encode(), self.role.encode(), self.kwargs]
        if self.format >= 2:
            assert self.levels is not None and self.n_fixed is not None  # None in format 1 only
            parts += [
                int(self.levels).to_bytes(4, "little", signed=True),
                bytes(self.flags),
                int(self.n_fixed).to_bytes(4, "little", signed=True),
            ]
        if self.format >= 3:
            parts.append(self.trees)
        if self.format >= 4:
            parts.append(self.definition.encode())
        for part in parts:
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
        return int.from_bytes(h.digest(), "little", signed=True)

    def ffi_attributes(self) -> dict[str, Any]:
        """The FFI attributes of the custom call (this format only)."""
        assert self.format == FORMAT and self.levels is not None and self.n_fixed is not None
        return dict(
            jaxbind_format=np.int32(FORMAT),
            site=np.int64(self.digest),
            binding=self.binding,
            role=self.role,
            kwargs=np.frombuffer(self.kwargs, dtype=np.uint8),
            loop_levels=np.int32(self.levels),
            loop_batched=np.frombuffer(self.flags, dtype=np.uint8),
            n_fixed=np.int32(self.n_fixed),
            trees=np.frombuffer(self.trees, dtype=np.uint8),
            definition=self.definition,
        )
