"""A state's setup that calls an op using the state it is making fails at once, naming
the op, the state and the fix (eagerly, under jit, through a jitted function or an
exported program, with both APIs, with key=), and a nested call that frees its caller's
key value does not wait for the caller. The cases run in a subprocess with a time limit
(state_setup_cases.py), so that a regression fails instead of hanging the suite."""

import pytest
from state_setup_cases import CASES
from support.processes import run_cases

NAMES = [case.__name__[len("case_") :] for case in CASES]


@pytest.fixture(scope="module")
def found():
    return run_cases("state/state_setup_cases.py")


@pytest.mark.parametrize("case", NAMES)
def test_a_setup_or_teardown_never_waits_for_its_own_caller(found, case):
    assert case in found, "not run: an earlier case hung"
    assert found[case]["ok"], found[case]["detail"]
