"""CallSpec: the one parameter the jaxbind primitive is bound with.

It is frozen and hashable, so equal calls give equal jaxpr equations and hit
JAX's caches. It names the binding (by identity), the role being called, how
many leading arguments are fixed, the keyword arguments and, once batched, the
batch axes of every input and output: the one representation of batching.
With ``func_can_batch`` the callables receive those axes as ``batch_axes``;
otherwise jaxbind loops over the batch itself, and `loop` derives that loop
from the same axes (the lowering writes it as explicit call attributes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._binding import Binding
from ._callformat import NO_LOOP, Loop
from ._kwargs import KwargsDump

__all__ = ["CallSpec", "BatchAxes"]

# One tuple of batch axes per array, outermost vmap last (JAXbind's protocol).
BatchAxes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class CallSpec:
    binding: Binding
    role: str  # see _binding: "f", "T", "jvp", "vjp", "T<i>"
    n_fixed: int  # leading arguments this role is not linear/differentiable in
    kwargs: KwargsDump  # the user's keyword arguments (batch_axes not included)
    batch_axes: BatchAxes | None = None  # per input, when batched natively
    out_batch_axes: BatchAxes | None = None  # per output, when batched natively
    n_lead: int = 0  # multilinear "T<i>": number of leading (non-cotangent) args
    # Output (shape, dtype)s without batch axes, for a transpose or VJP whose binding
    # has no abstract function for it: the transpose rule knows them (the primals').
    out_hint: tuple | None = None

    def __repr__(self):
        text = f"{self.binding.name}:{self.role}"
        if self.kwargs._values:
            text += f" kwargs={self.kwargs!r}"
        if self.batch_axes is not None:
            text += f" batch_axes={self.batch_axes}"
        return text

    @property
    def name(self) -> str:
        return self.binding.name

    def derive(self, role: str, n_fixed: int, batch_axes, out_batch_axes, n_lead: int = 0):
        """The spec of another role of the same binding, keeping the keyword arguments."""
        if self.batch_axes is None:
            batch_axes = out_batch_axes = None
        return replace(
            self,
            role=role,
            n_fixed=n_fixed,
            batch_axes=batch_axes,
            out_batch_axes=out_batch_axes,
            n_lead=n_lead,
            out_hint=None,
        )

    @property
    def loop(self) -> Loop:
        """jaxbind's own batch loop for this call (none when batched natively or unbatched)."""
        if self.batch_axes is None or self.binding.options.vectorized:
            return NO_LOOP
        # _rules.batching._batch_looped puts every batch axis first, outermost level at axis 0
        return Loop(
            max(len(ax) for ax in self.batch_axes), tuple(bool(ax) for ax in self.batch_axes)
        )

    def call_kwargs(self) -> KwargsDump:
        """Keyword arguments as the callables and abstract functions see them."""
        if not self.binding.options.vectorized:
            return self.kwargs
        return self.kwargs.with_extra(batch_axes=self.batch_axes)  # JAXbind's protocol
