"""The matrix's cells that need a process of their own (run by test_matrix.py): exports saved
by pytest's process and loaded here, fresh, with the op defined again under its name; and
shard_map over 4 CPU devices. Argument: the folder with cells.json (and <cell>.bin, the
saved exports). Prints one JSON line per cell (support.processes.run_cases)."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

import json
import pathlib
import traceback

import jax

jax.config.update("jax_enable_x64", True)

from conformance.forms import FORMS  # noqa: E402
from conformance.matrix import Cell  # noqa: E402
from conformance.transforms import _op, _twin, judge, outcome  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402


def shard_map(f, mesh, spec):
    """jax.shard_map (jax >= 0.8), else jax.experimental.shard_map (jax 0.7)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec)
    from jax.experimental.shard_map import shard_map as old

    return old(f, mesh=mesh, in_specs=spec, out_specs=spec)


def loaded(cell: Cell, folder: pathlib.Path):
    xs = FORMS[cell.dtype].inputs_for(seed=0)
    built = _op(cell)  # the op defined in this process, under the name the program calls
    exported = jax.export.deserialize(bytearray((folder / f"{cell.name}.bin").read_bytes()))
    result = exported.call(*xs)
    del built  # (kept alive until here: a binding lives as long as its op)
    return result


def sharded(cell: Cell):
    xs = FORMS[cell.dtype].inputs_for(seed=2, batch=4)
    built = _op(cell)
    mesh = Mesh(jax.devices()[:4], ("i",))
    spec = PartitionSpec("i")
    return jax.jit(shard_map(built.call, mesh, spec))(*xs)


def main(folder: pathlib.Path):
    for fields in json.loads((folder / "cells.json").read_text()):
        cell = Cell(**fields)
        try:
            if cell.transform == "export":
                xs = FORMS[cell.dtype].inputs_for(seed=0)
                want = outcome(lambda: jax.jit(_twin(cell))(*xs))
                got = outcome(lambda: loaded(cell, folder))
            else:
                xs = FORMS[cell.dtype].inputs_for(seed=2, batch=4)
                want = outcome(lambda: jax.jit(_twin(cell))(*xs))
                got = outcome(lambda: sharded(cell))
            judge(cell, got, want)
            result = {"case": cell.id, "ok": True, "detail": ""}
        except Exception:
            result = {"case": cell.id, "ok": False, "detail": traceback.format_exc(limit=4)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
