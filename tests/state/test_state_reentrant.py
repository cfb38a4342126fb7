"""A body that calls its own op on the thread whose call holds the op's state never waits
for itself: under "lock" (and a full "pool") the nested call fails naming the op and the
fix, for Python bodies and compiled kernels alike; "pool" with room and "shared" give the
nested call an object. The cases run in a subprocess with a time limit
(state_reentrant_cases.py), so that a regression fails instead of hanging the suite."""

import json

import pytest
from support.clib import compile_c_library
from support.processes import TESTS, run_python

_C_SOURCE = r"""
#include "jaxbind/kernel.h"

/* out = state->scale * x (float32) */
int32_t scaled(const jaxbind_call *call) {
  const double scale = *(const double *)call->state;
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->inputs[0].rank; ++d) n *= call->inputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = (float)(scale * x[i]);
  return 0;
}
"""

CASES = [
    "lock_eager",
    "lock_jitted",
    "pool_of_one",
    "pool_gives_the_nested_call_its_own_object",
    "shared",
    "kernel_under_a_python_body_lock",
]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    lib = compile_c_library(tmp_path_factory, "reentrant", _C_SOURCE)
    proc = run_python(
        TESTS / "state" / "state_reentrant_cases.py", lib._name, timeout=300, cwd=TESTS
    )
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            found[entry["case"]] = entry
    return proc, found


@pytest.mark.parametrize("case", CASES)
def test_a_body_calling_its_own_op_never_waits_for_itself(cases, case):
    proc, found = cases
    assert case in found, f"not run (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    assert found[case]["ok"], found[case]["detail"]


def test_the_process_exits_after_re_entrant_calls(cases):
    proc, found = cases
    assert set(found) == set(CASES)
    assert proc.returncode == 0, proc.stderr[-3000:]
