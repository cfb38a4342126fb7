"""The conformance matrix: kinds of body × APIs × dtypes × options × transformations.

Every axis is a table here, and the cells are their product. A cell builds one op
(bodies.build), applies one transformation to it and to its pure-JAX twin (forms.py), and
gives one of:

- the twin's answer (forward values also against NumPy), within the dtype's tolerance;
- an error naming the op, where the matrix says the op refuses (`refusal`);
- an error of any kind where JAX refuses the twin as well (e.g. a Hessian in complex inputs);

never a crash, a hang or another number. The "c_host" transformation writes a bundle of the
op's forward values and gradient (jaxbind.bundle) and runs it without Python, in
demos/run_bundle.c with jaxbind's C runtime: C kernels run there natively, every other body
by its reference, and an op with neither is refused when the bundle is written, naming it
(docs/without-python.md); the cell skips, saying what to install, without a CPU PJRT plugin.
test_matrix.py runs the cells; CI runs a sample that covers every pair of values of the
axes (`sample`), JAXBIND_MATRIX=full runs all. test_matrix_coverage.py ties the axes to
the project's own tables: a new kind of body, target or option fails it until a row here
covers it.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass

import jax

from jaxbind._roles import Body

from .forms import FORMS

# --- the axes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BodyKind:
    """A kind of body: what computes the op's roles (see bodies.py).

    Attributes:
      body: f's kind of body, its row of the project's table (jaxbind._roles.Body): where
        it runs (its platforms) decides whether a cell can run on this CPU.
      bodies: the project's kinds of body among all its roles' bodies.
      kernel_class: the class of its compiled bodies ("" for none).
      rules: how the derivative roles are given ("declared": of the same kind, "jax":
        JAX functions, "derived": none, derived from the reference).
      reference: whether the op has a JAX reference.
    """

    body: Body
    bodies: tuple[Body, ...]
    kernel_class: str = ""
    rules: str = "declared"
    reference: bool = True


_CALLABLE, _KERNEL, _CUDA = Body.CALLABLE, Body.KERNEL, Body.CUDA_KERNEL
_STREAM, _GRAPH_SAFE = Body.STREAM_KERNEL, Body.GRAPH_SAFE_KERNEL
BODY_KINDS = {
    "callable": BodyKind(_CALLABLE, (_CALLABLE,)),
    "numba": BodyKind(_KERNEL, (_KERNEL,), "Kernel"),
    "c": BodyKind(_KERNEL, (_KERNEL,), "Kernel"),
    "jax": BodyKind(_CALLABLE, (_CALLABLE, Body.JAX), rules="jax"),
    "derived": BodyKind(_CALLABLE, (_CALLABLE, Body.DERIVED), rules="derived"),
    "cuda": BodyKind(_CUDA, (_CUDA,), "CudaKernel"),  # on a CPU-only machine: the reference runs
    "cuda_noref": BodyKind(_CUDA, (_CUDA,), "CudaKernel", reference=False),  # refused, by name
    # kernels for CUDA (jaxbind.kernel(platform="cuda")): as the CUDA kernel's rows here
    "stream": BodyKind(_STREAM, (_STREAM,), "StreamKernel"),
    "stream_noref": BodyKind(_STREAM, (_STREAM,), "StreamKernel", reference=False),
    "graph_safe": BodyKind(_GRAPH_SAFE, (_GRAPH_SAFE,), "GraphSafeKernel"),
}

APIS = ("jaxbind13", "native")

DTYPES = tuple(FORMS)  # the forms: linear and nonlinear per float dtype; int32, bool, mixed

# Options the cells vary: each a variant of the op's definition, per API (the options it
# passes to bodies.build; None: the API has no cell of it, see `why`)
OPTION_VARIANTS = {
    "plain": {"jaxbind13": {}, "native": {}},
    "prefer_reference": {
        "jaxbind13": {"prefer_reference": ("cpu",)},
        "native": {"prefer_reference": ("cpu",)},
    },
    # (func_can_batch's abstract functions place batch axes themselves: tests/ops/test_batching.py)
    "vectorized": {"jaxbind13": None, "native": {"vectorized": True}},
}

# The options a cell does not vary, and where their combinations are tested instead
OPTIONS_ELSEWHERE = {
    "fixed": "tests/ops/test_fixed_spellings.py, tests/ops/test_linear.py (fixed arguments)",
    "platform_mode": "tests/gpu (GPU only; read at run time)",
    "aliases": "tests/runtime/test_aliasing.py",
    "effect": "tests/runtime/test_effects.py (an op with effects takes no reference)",
    "linear_in": "tests/ops/test_linear_in.py",
    "pytree_api": "tests/ops/test_pytree_api.py (the API that made the op: every cell runs both)",
    "state": "tests/state",
    "state_key": "tests/state",
    "sharding": "tests/sharding (a declared rule); the matrix's shard_map splits plain ops",
}

# The rows of the lowering table (jaxbind._rules.targets.TARGETS, by name and platform) and
# what exercises each: the matrix's own cells, or tests elsewhere where a cell cannot run here
TARGET_ROWS = {
    ("jaxbind_cpu", "cpu"): "matrix: every kind with a body that runs on the CPU",
    (
        "jaxbind_cpu_effect",
        "cpu",
    ): "tests/runtime/test_effects.py (an op with effects takes no reference)",
    ("jaxbind_partitioned", "cpu"): "tests/sharding/test_partitioning.py (a declared rule)",
    (
        "jaxbind_cuda",
        "cuda",
    ): (
        "tests/gpu/test_gpu.py (needs a GPU), tests/kernels/test_stream_kernels.py "
        "(kernels for CUDA lowered, and run on host memory)"
    ),
    ("jaxbind_cuda_effect", "cuda"): "tests/gpu/test_gpu.py (needs a GPU)",
    (
        "jaxbind_partitioned",
        "cuda",
    ): "tests/sharding/cuda_rule_cases.py (lowered for CUDA on a CPU)",
    (
        "jaxbind_cuda_kernel",
        "cuda",
    ): (
        "tests/gpu/test_gpu_kernels.py (needs a GPU), tests/kernels/test_stream_kernels.py "
        "(graph-safe kernels for CUDA lowered)"
    ),
    ("jaxbind_cuda_kernel_partitioned", "cuda"): "tests/gpu/test_gpu_kernels.py (needs a GPU)",
    ("", "any"): (
        "matrix: the kinds cuda, stream, graph_safe and derived; portable, use_reference*; "
        "prefer_reference"
    ),
}

TRANSFORMS = (
    "eager",
    "jit",
    "grad",
    "jvp",
    "vjp",
    "vmap",
    "vmap_grad",
    "hessian",
    "linear_transpose",
    "export",  # saved, loaded in a fresh process (matrix_cases.py)
    "shard_map",  # on 4 CPU devices, in a process of its own (matrix_cases.py)
    "portable",
    "use_reference",
    "use_reference_strict",
    "use_reference_in_trace",
    "replace",  # redefined with replace=True after a program was compiled
    "check",  # jaxbind.testing.check passes
    "c_host",  # a bundle run by a PJRT host in C with jaxbind's C runtime, without Python
)
IN_SUBPROCESS = ("export", "shard_map")


@dataclass(frozen=True)
class Cell:
    kind: str
    api: str
    dtype: str
    option: str
    transform: str

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.api}-{self.dtype}-{self.option}-{self.transform}"

    @property
    def name(self) -> str:
        """The op's name (unique per cell: replace redefines it)."""
        return "conformance." + self.id.replace("/", "_")

    def refusal(self) -> str | None:
        """Why the op must refuse this cell with an error naming it (None: it must not)."""
        kind = BODY_KINDS[self.kind]
        if self.option == "vectorized" and kind.kernel_class:
            return "a compiled kernel batches through jaxbind.kernel(batches=True), not vectorized="
        if self.option == "prefer_reference" and not kind.reference:
            return "prefer_reference= without a reference is refused when the op is defined"
        if not kind.reference and "cpu" not in kind.body.platforms and self.transform != "check":
            # (check reports each row "not checked" on a CPU: nothing runs the kernel there)
            return "a body that does not run on the CPU, without a reference, cannot run there"
        return None


def all_cells() -> list[Cell]:
    return [
        Cell(*c)
        for c in itertools.product(BODY_KINDS, APIS, DTYPES, OPTION_VARIANTS, TRANSFORMS)
        if OPTION_VARIANTS[c[3]][c[1]] is not None
    ]


def sample(seed: int) -> list[Cell]:
    """Cells that cover every pair of values of any two axes, drawn greedily in a seeded
    order (so each CI lane runs another sample)."""
    cells = all_cells()
    random.Random(seed).shuffle(cells)
    axes = ("kind", "api", "dtype", "option", "transform")

    def pairs(cell):
        values = [(a, getattr(cell, a)) for a in axes]
        return set(itertools.combinations(values, 2))

    covers = [pairs(c) for c in cells]
    uncovered = set().union(*covers)
    chosen = []
    for need in range(len(next(iter(covers))), 0, -1):  # cells that add the most pairs first
        for cell, its in zip(cells, covers):
            if len(its & uncovered) >= need:
                chosen.append(cell)
                uncovered -= its
    return chosen


def cells_to_run() -> list[Cell]:
    if os.environ.get("JAXBIND_MATRIX", "sample") == "full":
        return all_cells()
    seed = os.environ.get("JAXBIND_MATRIX_SEED")
    return sample(int(seed) if seed else _lane_seed())


def _lane_seed() -> int:
    """Each setup (Python, JAX) draws its own sample, the same on every run."""
    import sys

    return sum(map(ord, f"{sys.version_info[:2]} {jax.__version__}"))
