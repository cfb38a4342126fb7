"""The conformance matrix (matrix.py): each cell gives the pure-JAX twin's answer, or an error
naming the op where the matrix says it refuses. CI runs a sample covering every pair of
values of two axes (another per setup); JAXBIND_MATRIX=full runs every cell."""

import json
import os

import jax
import pytest
from conformance.forms import FORMS
from conformance.matrix import IN_SUBPROCESS, cells_to_run
from conformance.misuses import all_misuses
from conformance.misuses import sample as sample_misuses
from conformance.transforms import _op, check_cell, check_misuse, judge, outcome
from support.dtypes import global_x64
from support.pjrt_host import build_host
from support.processes import run_cases

import jaxbind

CELLS = cells_to_run()
MISUSES = (
    all_misuses() if os.environ.get("JAXBIND_MATRIX") == "full" else sample_misuses(len(CELLS))
)
HERE = [c for c in CELLS if c.transform not in IN_SUBPROCESS]
AWAY = [c for c in CELLS if c.transform in IN_SUBPROCESS]


@pytest.fixture(scope="session")
def c_host(tmp_path_factory):
    """The C host (demos/run_bundle.c), built once per session; skips without a plugin."""
    return build_host(tmp_path_factory)


@pytest.mark.parametrize("cell", HERE, ids=lambda c: c.id)
def test_cell(cell, enable_x64, request):
    check_cell(cell, host=lambda: request.getfixturevalue("c_host"))


@pytest.fixture(scope="module")
def away(tmp_path_factory):
    """The cells that run in a process of their own, all in one run of matrix_cases.py:
    exports saved here (an export that fails here is judged here), loaded there; shard_map
    on 4 CPU devices there."""
    where = tmp_path_factory.mktemp("matrix")
    judged_here = {}
    run_there = []
    with global_x64(True):
        for cell in AWAY:
            if cell.transform == "export":
                xs = FORMS[cell.dtype].inputs_for(seed=0)
                saved = outcome(lambda: jaxbind.export(jax.jit(_op(cell).call))(*xs).serialize())
                if saved[0] == "error":
                    judged_here[cell.id] = saved
                    continue
                (where / f"{cell.name}.bin").write_bytes(saved[1])
            run_there.append(cell)
    (where / "cells.json").write_text(json.dumps([c.__dict__ for c in run_there]))
    found = run_cases("conformance/matrix_cases.py", str(where)) if run_there else {}
    return judged_here, found


@pytest.mark.parametrize("cell", AWAY, ids=lambda c: c.id)
def test_cell_in_its_own_process(cell, away):
    judged_here, found = away
    if cell.id in judged_here:  # the export failed in this process: was that a refusal?
        judge(cell, judged_here[cell.id], ("value", None))
        return
    assert cell.id in found, f"matrix_cases.py reported nothing for {cell.id}"
    assert found[cell.id]["ok"], found[cell.id]["detail"]


@pytest.mark.parametrize("case", MISUSES, ids=lambda c: c.id)
def test_misuse(case, enable_x64):
    check_misuse(case)
