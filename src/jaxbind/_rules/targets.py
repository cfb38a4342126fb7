"""jaxbind's lowering targets, one table: a row per target and platform.

Every call jaxbind lowers takes a row of `TARGETS`: the reference row (`REFERENCE`: no
custom call, the op's JAX reference inlined, on any platform; .lowering takes it where
.reference says so) or the row of an FFI target, and everything that depends on the
target reads that row: registration (`register_targets`, at import), the lowering
(.lowering: `pick` chooses a custom call's row), effects (a call with side effects takes its
platform's row that is not batch partitionable, so XLA runs it once, on one device) and
the partitioner (.spmd: a partitioned row's calls become, on each device, calls of its
`per_device` row; a CUDA kernel's keep their command-buffer-compatible target).

A row's columns:
- ``stages``: the FFI stages its handlers have: instantiate and execute (XLA keeps the
  call's Instance in its per-site slot, see cpp/site_life.h), or the execute stage alone
  (CUDA kernels: XLA keeps no slot, and a call's first run finds its site);
- ``batch_partitionable``: XLA's batch partitioner may split its calls along leading
  batch axes (calls marked with ``num_batch_dims``, see .partitioning);
- ``partitioner``: its calls carry a declared rule, and XLA's SPMD partitioner asks
  jaxbind (.spmd) how to split them; where nothing partitions them (a program compiled
  for one device) its handlers run them whole;
- ``command_buffers``: its handler may be captured into CUDA graphs (the C++ handler
  declares ``kCmdBufferCompatible``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _ext
from .._compat import ffi, register_batch_partitionable
from .._roles import XLA_PLATFORMS, Body

__all__ = [
    "REFERENCE",
    "TARGETS",
    "Target",
    "pick",
    "register_targets",
    "row",
    "target_names",
]

BOTH = ("instantiate", "execute")
EXECUTE = ("execute",)


@dataclass(frozen=True, slots=True)
class Target:
    """One FFI target on one platform (see the module's text for the columns).

    Attributes:
      name: the custom call's target name.
      platform: "cpu" or "cuda", as JAX's lowering names it ("any": the reference row).
      calls: which calls lower to it: "plain", "effect" (calls with side effects),
        "kernel" (calls of CUDA kernels, jaxbind.cuda_kernel) or "reference" (calls
        computed by the op's JAX reference: no custom call).
      handlers: the _ext function that gives its handlers, {stage: PyCapsule} ("": none,
        the reference row).
      per_device: the row of a device's part of a partitioned call (its own name else).
    """

    name: str
    platform: str
    calls: str
    handlers: str
    stages: tuple[str, ...]
    batch_partitionable: bool = False
    partitioner: bool = False
    command_buffers: bool = False
    per_device: str = ""

    @property
    def custom_call(self) -> bool:
        """Whether its calls are custom calls (every row but the reference row)."""
        return bool(self.handlers)

    @property
    def xla_platform(self) -> str:
        return XLA_PLATFORMS[self.platform]


TARGETS = (
    Target("jaxbind_cpu", "cpu", "plain", "cpu_handlers", BOTH, batch_partitionable=True),
    Target("jaxbind_cpu_effect", "cpu", "effect", "cpu_handlers", BOTH),
    Target(
        "jaxbind_partitioned", "cpu", "plain", "cpu_handlers", BOTH, partitioner=True,
        per_device="jaxbind_cpu",
    ),
    Target("jaxbind_cuda", "cuda", "plain", "cuda_handlers", BOTH, batch_partitionable=True),
    Target("jaxbind_cuda_effect", "cuda", "effect", "cuda_handlers", BOTH),
    Target(
        "jaxbind_partitioned", "cuda", "plain", "cuda_handlers", BOTH, partitioner=True,
        per_device="jaxbind_cuda",
    ),
    Target(
        "jaxbind_cuda_kernel", "cuda", "kernel", "cuda_kernel_handlers", EXECUTE,
        batch_partitionable=True, command_buffers=True,
    ),
    Target(
        "jaxbind_cuda_kernel_partitioned", "cuda", "kernel", "cuda_kernel_handlers", EXECUTE,
        partitioner=True, command_buffers=True, per_device="jaxbind_cuda_kernel",
    ),
    Target("", "any", "reference", "", ()),
)  # fmt: skip
REFERENCE = TARGETS[-1]
# (a platform has custom calls' rows where a kind of body runs itself: _roles.Body's
# platforms; tests/references/test_what_runs_where.py ties the two tables)


def pick(platform: str, kind: Body, *, effect: bool, partitioned: bool) -> Target:
    """The custom call's row of a call whose body, of `kind`, runs natively on `platform`
    (jaxbind._where.runs says when): its platform's row for calls with side effects, else
    that of the kind's ``calls``, partitioned by a declared rule or not."""
    calls = "effect" if effect else kind.calls
    for row in TARGETS:
        if row.platform == platform and row.calls == calls and row.partitioner == partitioned:
            return row
    raise LookupError(f"jaxbind: no FFI target for {calls} calls on {platform}")


def row(name: str, platform: str) -> Target:
    """The row of target `name` on `platform` (LookupError: none; a program may name any)."""
    for found in TARGETS:
        if found.name == name and found.platform == platform:
            return found
    raise LookupError(f"jaxbind: no FFI target {name!r} on {platform}")


def target_names() -> tuple[str, ...]:
    """Every target's name, once each (jax.export allows them)."""
    return tuple(dict.fromkeys(r.name for r in TARGETS if r.custom_call))


def register_targets() -> None:
    """Register every row's handlers with XLA on its platform (once, at import), as
    batch partitionable where it is. JAX keeps registrations for a platform whose plugin
    is not loaded (no GPU) and applies them when the CUDA plugin appears. (The
    partitioner of the partitioned rows is registered by .spmd, from this table.)"""
    for entry in TARGETS:
        if not entry.custom_call:
            continue
        ffi.register_ffi_target(
            entry.name, getattr(_ext, entry.handlers)(), platform=entry.xla_platform
        )
        if entry.batch_partitionable:
            register_batch_partitionable(entry.name)
