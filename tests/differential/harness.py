"""The two workers (worker.py under JAXbind 1.3.1 and under jaxbind) and the comparison of
their outcomes, row by row.

JAXbind 1.3.1 lives in a venv of its own, with the same jax and ducc0 as the Python under
test: ``JAXBIND13_PYTHON`` names its interpreter (.ci/run sets it; made by
benchmarks/compare_jaxbind13.sh, whose default venv is used when the variable is unset).
"""

from __future__ import annotations

import os
import pathlib
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = HERE / "worker.py"
DEFAULT_VENV_PYTHON = ROOT / "benchmarks" / ".venv-jaxbind13" / "bin" / "python"
ROW_TIMEOUT_S = 120


def reference_python() -> tuple[str | None, str]:
    """JAXbind 1.3.1's Python and where it came from, or (None, why there is none)."""
    named = os.environ.get("JAXBIND13_PYTHON")
    if named:
        return named, "JAXBIND13_PYTHON"
    if DEFAULT_VENV_PYTHON.exists():
        return str(DEFAULT_VENV_PYTHON), "benchmarks/.venv-jaxbind13"
    return None, (
        "no JAXbind 1.3.1 to compare with: set JAXBIND13_PYTHON to the python of a venv "
        "with jaxbind==1.3.1, ducc0 and this venv's jax (bash benchmarks/compare_jaxbind13.sh "
        "makes one, benchmarks/.venv-jaxbind13, which is then found without the variable)"
    )


class Worker:
    """worker.py served by one Python; restarted after a crash."""

    def __init__(self, python: str, label: str):
        self.python, self.label = python, label
        self.log = tempfile.NamedTemporaryFile(prefix=f"diff-{label}-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None
        self.versions = self._start()

    def _start(self) -> dict:
        env = dict(os.environ, JAXBIND_SILENCE_JAX_VERSION_WARNING="1", JAX_PLATFORMS="cpu")
        env.pop("PYTHONPATH", None)  # each Python imports its own jaxbind
        self.proc = subprocess.Popen(
            [self.python, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd=HERE,  # not the checkout's root: 1.3.1 must not see src/ or tests/
            env=env,
        )
        versions = self._read(time.monotonic() + 120)
        if versions is None:
            raise RuntimeError(f"{self.label} worker did not start: {self.log_tail()}")
        return versions

    def log_tail(self, n: int = 3000) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")[-n:]

    def _read(self, deadline):
        """One frame, or None when the worker died or passed the deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        out = self.proc.stdout

        def exactly(n):
            data = b""
            while len(data) < n:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([out], [], [], left)[0]:
                    return None
                chunk = os.read(out.fileno(), n - len(data))
                if not chunk:
                    return None
                data += chunk
            return data

        head = exactly(4)
        if head is None:
            return None
        body = exactly(struct.unpack(">I", head)[0])
        return None if body is None else pickle.loads(body)

    def send(self, rows) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        data = pickle.dumps([tuple(r) for r in rows], protocol=4)
        self.proc.stdin.write(struct.pack(">I", len(data)) + data)
        self.proc.stdin.flush()

    def collect(self, rows) -> dict:
        """The outcomes of `rows` (sent by `send`), by id; a row that crashed the worker
        or ran past ROW_TIMEOUT_S gets that as its outcome, and the rest run again in a
        fresh worker."""
        outcomes: dict = {}
        pending = [r for r in rows]
        while pending:
            current = None
            while True:
                frame = self._read(time.monotonic() + ROW_TIMEOUT_S)
                if frame is None:
                    break
                if frame[0] == "start":
                    current = frame[1]
                elif frame[0] == "done":
                    outcomes[frame[1]] = frame[2]
                    current = None
                else:  # the end of the batch
                    return outcomes
            # crashed or hung: record, restart, go on with what is left
            alive = self.proc is not None and self.proc.poll() is None
            if alive:
                self.proc.kill()
            self.proc.wait()
            if current is not None:
                outcomes[current] = {
                    "status": "crash" if not alive else "timeout",
                    "type": f"exit {self.proc.returncode}",
                    "message": self.log_tail(),
                }
            self.versions = self._start()
            pending = [r for r in pending if r[0] not in outcomes]
            if pending:
                self.send(pending)
        return outcomes

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def run_both(ref: Worker, ours: Worker, rows) -> tuple[dict, dict]:
    """The rows' outcomes under both workers, which run them at the same time."""
    ref.send(rows)
    ours.send(rows)
    return ref.collect(rows), ours.collect(rows)


def ours_python() -> str:
    return sys.executable


# --- comparing outcomes --------------------------------------------------------------


def accepted(outcome) -> bool:
    return outcome["status"] == "ok"


def _leaves(value, path="result"):
    if isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def value_difference(ref, ours, rtol: float) -> str | None:
    """Why two accepted results differ (structure, shape, dtype, values), or None."""
    ref_leaves, our_leaves = list(_leaves(ref)), list(_leaves(ours))
    if [p for p, _ in ref_leaves] != [p for p, _ in our_leaves]:
        return f"structure: {[p for p, _ in ref_leaves]} against {[p for p, _ in our_leaves]}"
    for (path, a), (_, b) in zip(ref_leaves, our_leaves):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                return f"{path}: {type(a).__name__} against {type(b).__name__}"
            if a.shape != b.shape or a.dtype != b.dtype:
                return f"{path}: {a.shape} {a.dtype} against {b.shape} {b.dtype}"
            if a.dtype.kind in "fc":
                # single precision: as close as its rounding allows (DUCC's order of
                # operations may differ, e.g. with the axes in another order)
                rtol = max(rtol, 100 * float(np.finfo(a.dtype).eps))
                finite = np.isfinite(a)
                if not np.array_equal(finite, np.isfinite(b)):
                    return f"{path}: non-finite at other places"
                scale = np.max(np.abs(a[finite]), initial=0.0)
                err = np.max(np.abs(a[finite] - b[finite]), initial=0.0)
                if err > rtol * scale:
                    return f"{path}: differs by {err:.3g} (relative {err / max(scale, 1e-300):.3g})"
            elif not np.array_equal(a, b):
                return f"{path}: differs"
        elif a != b:
            return f"{path}: {a!r} against {b!r}"
    return None


def describe(outcome) -> str:
    if outcome["status"] == "ok":
        return "accepted"
    first = outcome["message"].strip().splitlines()[0] if outcome["message"].strip() else ""
    return f"{outcome['status']}: {outcome['type']}: {first[:300]}"
