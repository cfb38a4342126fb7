"""Python run in a fresh process, with its output captured as text."""

import pathlib
import subprocess
import sys
import textwrap

TESTS = pathlib.Path(__file__).resolve().parent.parent


def run_python(*args, timeout=None, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python *args`` (this interpreter) in a new process; it does not raise when the
    process fails: the caller checks returncode, stdout and stderr."""
    return subprocess.run(
        [sys.executable, *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def run_script(directory, code, *args, name="script.py", **kwargs) -> subprocess.CompletedProcess:
    """`code` (dedented) written to `directory`/`name`, then run by run_python (which takes
    the keyword arguments)."""
    script = pathlib.Path(directory) / name
    script.write_text(textwrap.dedent(code))
    return run_python(script, *args, **kwargs)


def run_isolated(directory, code, *args, timeout=300, name="load.py"):
    """run_script in a process that runs JAX on the CPU only and imports the modules of
    tests/ (reference_ops, ...), with nothing else of this process's environment."""
    env = {"PYTHONPATH": str(TESTS), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    return run_script(directory, code, *args, name=name, timeout=timeout, cwd=TESTS, env=env)


def run_cases(script, *args):
    """A tests/ script that prints one JSON line per case (with its "case" name) run in a
    fresh process: the cases by name; the test fails if the script ran none."""
    import json

    import pytest

    proc = run_python(TESTS / script, *args, timeout=600, cwd=TESTS)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            found[entry["case"]] = entry
    if not found:
        pytest.fail(f"{script} ran no case (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return found
