"""What a compiled program sends between devices: its collectives, counted from its HLO.

For checks of ops that partition by a declared rule (``sharding=``): a deposit of points
onto a grid should compile to jaxbind's calls and one all-reduce, with no all-gather of
the points. `collectives` reads the optimized HLO text of a compiled program (the
``jax.stages.Compiled`` of ``jax.jit(f).lower(...).compile()``, or its text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["COLLECTIVES", "Collectives", "collectives"]

# XLA's collective instructions (an async pair counts once, by its "-start")
COLLECTIVES = (
    "all-gather",
    "all-reduce",
    "all-to-all",
    "collective-permute",
    "reduce-scatter",
    "collective-broadcast",
)
_INSTRUCTION = re.compile(  # "%x = f64[64]{0} all-reduce(...)", a tuple type "(f64[64], ...)"
    r"=\s*(?:\([^=]*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\((.*)$",
    re.MULTILINE,
)
# replica groups as XLA prints them: {{0,1},{2,3}}, an iota [2,2]<=[4]T(1,0), or (newer
# XLA) a mesh and its axes: mesh['axis_0'=4] {'axis_0'}
_GROUPS = re.compile(
    r"replica_groups=(\{[^ ]*\}|\[[^ ]*\]<=\[[^ ]*\](?:T\([^)]*\))?|mesh\[[^\]]*\]\s*\{[^}]*\})"
)
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


@dataclass(frozen=True)
class Collectives:
    """The collectives of one program: how many of each kind (`counts`), the replica
    groups of each in order (`groups`, XLA's text), and the custom-call targets it
    calls (`custom_calls`, in order)."""

    counts: Mapping[str, int]
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    custom_calls: tuple[str, ...] = ()

    def __getitem__(self, kind: str) -> int:
        return self.counts.get(kind, 0)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def collectives(compiled) -> Collectives:
    """The collectives of a compiled program (a ``Compiled``, or its HLO text)."""
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    counts = dict.fromkeys(COLLECTIVES, 0)
    groups: dict[str, list[str]] = {kind: [] for kind in COLLECTIVES}
    for match in _INSTRUCTION.finditer(text):
        kind = match.group(1)
        counts[kind] += 1
        found = _GROUPS.search(match.group(2))
        groups[kind].append(found.group(1) if found else "")
    return Collectives(
        counts, {k: tuple(v) for k, v in groups.items()}, tuple(_TARGET.findall(text))
    )
