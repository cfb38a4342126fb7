"""The demos run to the end (each checks itself against pure JAX)."""

import pathlib

import pytest
from support.processes import run_python

DEMOS = sorted((pathlib.Path(__file__).parents[2] / "demos").glob("*.py"))


@pytest.mark.parametrize("demo", DEMOS, ids=lambda p: p.name)
def test_demo_runs(demo):
    pytest.importorskip("scipy")
    if "ducc" in demo.name:
        pytest.importorskip("ducc0", reason="ducc0 is not installed")
    if "numba" in demo.name or "finufft" in demo.name:
        pytest.importorskip("numba", reason="numba is not installed")
    if "finufft" in demo.name:  # checked against jaxducc0
        pytest.importorskip("finufft", reason="finufft is not installed")
        pytest.importorskip("ducc0", reason="ducc0 is not installed")
    proc = run_python(demo, timeout=300, cwd=demo.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
