"""Two processes on localhost, each with 2 CPU devices, run a jaxbind op on a
4-device global mesh (jax.distributed). Bounded in time; both processes are
killed if they do not finish."""

import json
import pathlib
import socket
import subprocess
import sys

from support.processes import with_tests_on_path

HERE = pathlib.Path(__file__).parent
TIMEOUT = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_run_a_batch_sharded_op_on_the_global_mesh():
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "distributed_worker.py"), str(i), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=HERE,
            env=with_tests_on_path(),
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            outputs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out, err in outputs:
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"worker printed no result (exit {rc}):\n{err[-3000:]}"
        result = json.loads(lines[-1])
        assert result["ok"], result.get("detail")
        assert result["calls"] == 4, result  # 2 local devices x 2 batch rows each
        assert not result["gathers"], "the vmapped op was gathered instead of run per shard"
        assert "'b'" in result["sharding"], result
