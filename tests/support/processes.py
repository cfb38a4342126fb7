"""Python run in a fresh process, with its output captured as text, and the runner of the
case scripts (the ``*_cases.py`` beside the tests that run them, in tests/<feature>/).

Every process started here has tests/ on its path, as pytest's own process has: a script in
any folder of tests/ imports ``support`` and ``reference_ops``, and the modules beside it.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import traceback

TESTS = pathlib.Path(__file__).resolve().parent.parent


def with_tests_on_path(env=None) -> dict:
    """`env` (default: this process's environment) with tests/ first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    return env


def run_python(*args, timeout=None, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python *args`` (this interpreter) in a new process, tests/ on its path
    (with_tests_on_path; `env` default: this process's); it does not raise when the process
    fails: the caller checks returncode, stdout and stderr."""
    return subprocess.run(
        [sys.executable, *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=with_tests_on_path(env),
    )


def join_cpu_processes(process_id: int, port: int, count: int = 2) -> None:
    """This process joins `count` processes on localhost (the coordinator at `port`) in one
    JAX runtime, over CPU collectives: jax.distributed.initialize, within 60 s."""
    import jax

    try:  # CPU collectives across processes (jax 0.7 - 0.12)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception:
        pass
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=count,
        process_id=process_id,
        initialization_timeout=60,
    )


def refusing_imports(*packages: str) -> str:
    """Python source that makes importing any of the top-level `packages` fail, as if they
    were not installed: the first lines of a script that must run without them."""
    return textwrap.dedent(
        f"""
        import importlib.abc, sys
        class _Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {packages!r}:
                    raise ImportError(f"{{name}} is not installed here")
        sys.meta_path.insert(0, _Refuse())
        """
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
    env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}  # run_python adds tests/
    return run_script(directory, code, *args, name=name, timeout=timeout, cwd=TESTS, env=env)


def run_cases(script, *args):
    """A case script (its path relative to tests/, e.g. "sharding/sharding_cases.py") that
    prints one JSON line per case (with its "case" name) run in a fresh process: the cases by
    name; the test fails if the script ran none."""
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


def run_case_functions(namespace: dict, names=(), limit: int = 6, **extra) -> None:
    """The main of a case script: run the functions `names` of `namespace` (a script's
    globals(); default: every ``case_*`` in it) and print one JSON line per case,
    ``{"case", "ok", "detail", **extra}``: detail is what the case returned, or the
    traceback (`limit` frames) of what it raised."""
    for name in names or [n for n in namespace if n.startswith("case_")]:
        try:
            detail, ok = namespace[name](), True
        except Exception:
            detail, ok = traceback.format_exc(limit=limit), False
        line = {"case": name, "ok": ok, "detail": detail, **extra}
        print(json.dumps(line, default=str), flush=True)
