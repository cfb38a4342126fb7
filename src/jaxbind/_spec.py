"""CallSpec, the one parameter the jaxbind primitive is bound with, and BatchAxes.

A CallSpec is frozen and hashable, so equal calls give equal jaxpr equations and hit
JAX's caches. It names the binding (by identity), the role being called, how many
leading arguments the role is not linear in, the keyword arguments, the pytree
structure of the call (pytree API) and, once batched, the batch axes of every
input and output: the one representation of batching, `BatchAxes`. With
``func_can_batch`` the callables receive those axes as ``batch_axes``; otherwise
jaxbind loops over the batch itself, and `loop` derives that loop from the same
axes (the lowering writes it as explicit call attributes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ._callformat import NO_LOOP, Loop

if TYPE_CHECKING:  # annotations only (no floor: tests/test_layers.py)
    from ._binding import Binding
    from ._kwargs import KwargsDump
    from ._roles import RoleDef

__all__ = ["BatchAxes", "CallSpec"]


@dataclass(frozen=True, slots=True)
class BatchAxes:
    """The batch axes of each array of a call: one tuple per array, innermost vmap first
    (JAXbind's protocol: outermost vmap last); ``()`` for an array without batch axes.

    Every batch axis jaxbind moves, it moves through this type: `to_front` puts the
    batch axes of each array first, outermost level at axis 0 (as jaxbind's loop,
    its transposes and its JAX-function roles lay batches out), and `from_front`
    puts them back.
    """

    axes: tuple[tuple[int, ...], ...]

    @staticmethod
    def none(n: int) -> BatchAxes:
        """`n` arrays without batch axes."""
        return BatchAxes(((),) * n)

    @staticmethod
    def leading(levels: int, n: int) -> BatchAxes:
        """`n` arrays with `levels` leading batch axes each, outermost at axis 0."""
        return BatchAxes((tuple(reversed(range(levels))),) * n)

    def __len__(self) -> int:
        return len(self.axes)

    def __iter__(self):
        return iter(self.axes)

    def __getitem__(self, which):
        """One array's axes (an int), or the layout of some arrays (a slice)."""
        if isinstance(which, slice):
            return BatchAxes(self.axes[which])
        return self.axes[which]

    def __add__(self, other: BatchAxes) -> BatchAxes:
        return BatchAxes(self.axes + other.axes)

    def pick(self, indices: Sequence[int]) -> BatchAxes:
        return BatchAxes(tuple(self.axes[i] for i in indices))

    @property
    def levels(self) -> int:
        """The number of vmap levels (the most batch axes any array has)."""
        return max((len(ax) for ax in self.axes), default=0)

    @property
    def batched(self) -> tuple[bool, ...]:
        """Which arrays have batch axes."""
        return tuple(bool(ax) for ax in self.axes)

    def front(self) -> BatchAxes:
        """The layout after `to_front`: each array's batch axes leading, outermost first."""
        return BatchAxes(tuple(tuple(reversed(range(len(ax)))) for ax in self.axes))

    @property
    def all_leading(self) -> bool:
        """Whether every array has all `levels` batch axes in front, outermost first."""
        return self.levels > 0 and self == BatchAxes.leading(self.levels, len(self))

    def to_front(self, arrays, moveaxis: Callable) -> list:
        """`arrays` with their batch axes moved to the front, outermost level at axis 0."""
        return [
            moveaxis(a, list(reversed(ax)), list(range(len(ax)))) if ax else a
            for a, ax in zip(arrays, self.axes)
        ]

    def from_front(self, arrays, moveaxis: Callable) -> list:
        """The inverse of `to_front`: arrays laid out by `front()` put back in this layout."""
        return [
            moveaxis(a, list(range(len(ax))), list(reversed(ax))) if ax else a
            for a, ax in zip(arrays, self.axes)
        ]

    def core_shape(self, shape, i: int) -> tuple:
        """Array i's shape without its batch axes."""
        drop = set(self.axes[i])
        return tuple(d for k, d in enumerate(shape) if k not in drop)

    def sizes(self, shapes) -> tuple:
        """The size of each batch level, outermost first, read from the first batched array."""
        return next(
            (tuple(s[k] for k in reversed(ax)) for s, ax in zip(shapes, self.axes) if ax), ()
        )


@dataclass(frozen=True, slots=True)
class CallSpec:
    binding: Binding
    role: str  # see _roles: "f", "T", "jvp", "vjp", "T<i>"
    n_fixed: int  # leading arguments this role is not linear/differentiable in
    kwargs: KwargsDump  # the user's keyword arguments (batch_axes not included)
    batch_axes: BatchAxes | None = None  # per input, once batched
    out_batch_axes: BatchAxes | None = None  # per output, once batched
    n_lead: int = 0  # multilinear "T<i>": number of leading (non-cotangent) args
    # Output (shape, dtype)s without batch axes, for a transpose or VJP whose binding
    # has no abstract function for it: the transpose rule knows them (the primals').
    out_hint: tuple | None = None
    # The call's pytree structure (pytree API; see _pytree_api.trees.call_trees), or None.
    trees: object = None
    # Run by the host callback that carries the binding's effect (see _rules.lowering,
    # effects under Shardy): this call has no effect of its own.
    hosted: bool = False

    def __repr__(self):
        text = f"{self.binding.name}:{self.role}"
        if self.kwargs._values:
            text += f" kwargs={self.kwargs!r}"
        if self.batch_axes is not None:
            text += f" batch_axes={self.batch_axes.axes}"
        return text

    @property
    def name(self) -> str:
        return self.binding.name

    @property
    def entry(self) -> RoleDef:
        """The role's entry in the binding's role table."""
        return self.binding.role(self.role)

    @property
    def batched(self) -> bool:
        return self.batch_axes is not None

    def derive(self, role: str, n_fixed: int, batch_axes, out_batch_axes, n_lead: int = 0):
        """The spec of another role of the same binding, keeping the keyword arguments
        and the pytree structure."""
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

    def unbatched(self) -> CallSpec:
        return replace(self, batch_axes=None, out_batch_axes=None)

    @property
    def body_batched(self) -> bool:
        """Batched, with the body handling the batch itself (func_can_batch)."""
        return self.batch_axes is not None and self.binding.options.vectorized

    @property
    def loop(self) -> Loop:
        """jaxbind's own batch loop for this call (none when vectorized or unbatched)."""
        if self.batch_axes is None or self.binding.options.vectorized:
            return NO_LOOP
        # _rules.batching.batch_looped puts every batch axis first, outermost level at axis 0
        return Loop(self.batch_axes.levels, self.batch_axes.batched)

    def call_kwargs(self) -> KwargsDump:
        """Keyword arguments as the callables and abstract functions see them."""
        if not self.binding.options.vectorized:
            return self.kwargs
        axes = None if self.batch_axes is None else self.batch_axes.axes
        return self.kwargs.with_extra(batch_axes=axes)  # JAXbind's protocol
