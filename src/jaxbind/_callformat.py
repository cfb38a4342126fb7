"""The attributes of a jaxbind custom call, shared by the lowering and the runtime.

A compiled or exported program names its jaxbind calls by these FFI attributes
(call format 2; the trampoline in cpp/ checks ``jaxbind_format`` first):

- ``jaxbind_format`` (int32): the format version, 2. Format 1 programs still run.
- ``binding`` (str): the binding's name; the process must have created it.
- ``role`` (str): which of the binding's callables, see :class:`jaxbind._roles.Role`.
- ``kwargs`` (uint8 array): the keyword arguments the callables receive, encoded
  (see _kwargs); for a natively batched call they include ``batch_axes``.
- ``loop_levels`` (int32) and ``loop_batched`` (one uint8 flag per input):
  jaxbind's own batch loop, see :class:`Loop` (format 1 kept it inside ``kwargs``).
- ``n_fixed`` (int32): the role's leading arguments that are not linear or
  differentiated, which the runtime needs to evaluate the abstract function.
- ``site`` (int64): a digest of all of the above. It names the call site in the
  trampoline's cache; it detects accidents, not tampering, so the runtime checks
  every attribute and the buffers themselves when it first sees a site.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

__all__ = ["FORMAT", "Loop", "NO_LOOP", "site_digest"]

FORMAT = 2


class Loop(NamedTuple):
    """jaxbind's own batch loop over one call (see _batching._batch_looped).

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


def site_digest(
    name: str,
    role: str,
    blob: bytes,
    levels: int | None = None,
    flags: bytes = b"",
    n_fixed: int = 0,
) -> int:
    """Signed 64-bit digest of one call site's attributes.

    Format 1 digests cover (name, role, kwargs); format 2 digests also cover
    ``loop_levels``, ``loop_batched`` (`flags`) and ``n_fixed``.
    """
    h = hashlib.blake2b(digest_size=8)
    parts = [name.encode(), role.encode(), blob]
    if levels is not None:
        parts += [
            int(levels).to_bytes(4, "little", signed=True),
            bytes(flags),
            int(n_fixed).to_bytes(4, "little", signed=True),
        ]
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return int.from_bytes(h.digest(), "little", signed=True)
