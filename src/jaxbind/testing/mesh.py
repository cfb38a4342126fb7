"""Rows of an op that declares how it partitions (``sharding=``, ``reduction=``).

check runs on one device, where such an op runs as without its rule, so this family says
so in a "not checked" row. What it leaves to its caller: run the op under ``jax.jit``
on arrays sharded over several devices and compare with one device, and count the
collectives of the compiled program (`jaxbind.testing.collectives`), as
tests/test_partitioning.py does on 4 CPU devices. The rule itself is checked by the
op's creation (its syntax, its derivatives' rules, the options it refuses) and by every
call (its arity, ranks and factor sizes).
"""

from __future__ import annotations

from collections.abc import Iterator

from .case import Case, Family
from .report import CheckResult

__all__ = ["FAMILY"]


def _applies(case: Case) -> bool | str:
    options = case.binding.options
    if options.sharding is None:
        return False
    return (
        f"the op declares sharding={options.sharding!r}; check runs it on one device, where "
        "it runs whole: run it under jax.jit on arrays sharded over several devices against "
        "one device, and count the collectives (jaxbind.testing.collectives)"
    )


def _rows(case: Case) -> Iterator[CheckResult]:
    return iter(())  # never reached: _applies says why there are no rows


FAMILY = Family(
    name="sharding rule on a mesh",
    checks=(),
    roles=frozenset(),
    options=frozenset({"sharding", "reduction"}),
    applies=_applies,
    rows=_rows,
)
