"""No teardown after the interpreter has begun to exit (docs/state.md), whatever holds
the state then: the cases run in their own processes (state_exit_cases.py)."""

import pytest
from support.processes import TESTS, run_python


def _lines(case: str) -> list[str]:
    proc = run_python(TESTS / "state" / "state_exit_cases.py", case, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.isupper() or " " in line]
    assert "MAIN ENDS" in lines and "EXIT BEGAN" in lines, (lines, proc.stderr[-3000:])
    return lines


@pytest.mark.parametrize("case", ["daemon_threads", "quiet"])
def test_no_teardown_runs_once_the_interpreter_has_begun_to_exit(case):
    lines = _lines(case)
    assert "TEARDOWN" not in lines[lines.index("MAIN ENDS") :], lines


def test_a_thread_the_interpreter_waits_for_still_tears_down_before_exit():
    lines = _lines("worker")
    assert lines.index("MAIN ENDS") < lines.index("TEARDOWN") < lines.index("EXIT BEGAN"), lines
    assert lines.count("TEARDOWN") == 1
