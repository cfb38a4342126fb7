"""jaxbind.testing.check(mesh=) on 4 CPU devices: forward mode (JVPs) split by the op's rule
is compared with one device, so a JVP right only on the whole array fails. The cases run in
mesh_check_cases.py, in a subprocess that sets the device count before importing JAX (the
values, reverse mode and collectives rows: partitioning_cases.py)."""

import pathlib

import pytest
from support.processes import run_cases

HERE = pathlib.Path(__file__).parent

CASES = [
    "case_check_compares_forward_mode_on_a_mesh",
    "case_check_fails_a_jvp_right_only_on_the_whole_array",
]


@pytest.fixture(scope="module")
def results():
    return run_cases("testing/mesh_check_cases.py")


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_check_on_four_devices(results, case):
    entry = results.get(case)
    assert entry is not None, f"{case} did not run"
    assert entry["ok"], entry["detail"]


def test_every_case_is_listed():
    text = (HERE / "mesh_check_cases.py").read_text()
    defined = {line[4:].split("(")[0] for line in text.splitlines() if line.startswith("def case_")}
    assert defined == set(CASES)
