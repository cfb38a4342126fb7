"""A PJRT host without Python for tests: demos/run_bundle.c built with the C compiler
against a CPU PJRT plugin's C API header and jaxbind's runtime, run on a bundle.

The plugin: JAXBIND_PJRT_PLUGIN (a path), else the first of the CPU plugin packages
installed (fastatomstruct-xla-cpu, lammps-jax-pjrt-cpu, xla-cpu-pjrt); the header
(pjrt_c_api.h): JAXBIND_PJRT_INCLUDE (a directory), else xla-cpu-pjrt's. Without them the
tests skip, saying what to install (benchmarks/pjrt_host.py finds them here too)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

ROOT = pathlib.Path(__file__).parents[2]
INSTALL = (
    'needs a CPU PJRT plugin and the PJRT C API header: pip install ".[pjrt]" in the clone '
    "(fastatomstruct-xla-cpu, and xla-cpu-pjrt for its include/pjrt_c_api.h), or set "
    "JAXBIND_PJRT_PLUGIN and JAXBIND_PJRT_INCLUDE"
)
# (package, the plugin's file in it)
_PLUGINS = (
    ("fastatomstruct_xla_cpu", "libpjrt_cpu.so"),
    ("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so"),
    ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so"),
)


def _package_dir(name: str) -> pathlib.Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def plugin_path() -> str | None:
    """The CPU PJRT plugin the tests use, or None."""
    if os.environ.get("JAXBIND_PJRT_PLUGIN"):
        return os.environ["JAXBIND_PJRT_PLUGIN"]
    for package, file in _PLUGINS:
        folder = _package_dir(package)
        if folder is not None and (folder / file).exists():
            return str(folder / file)
    return None


def include_dir() -> str | None:
    """A directory with pjrt_c_api.h, or None."""
    if os.environ.get("JAXBIND_PJRT_INCLUDE"):
        return os.environ["JAXBIND_PJRT_INCLUDE"]
    folder = _package_dir("xla_plugins.xla_cpu_pjrt")
    if folder is not None and (folder / "include" / "pjrt_c_api.h").exists():
        return str(folder / "include")
    return None


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@dataclass(frozen=True)
class Host:
    """The built driver and the plugin it loads."""

    driver: pathlib.Path
    plugin: str

    def run(
        self, bundle: str, *inputs: np.ndarray, repeat: int = 0, out: pathlib.Path | None = None
    ):
        """Run the bundle on `inputs` (written next to it); returns the finished process
        (stdout, stderr, returncode) and, if it succeeded, the outputs as the manifest
        types them."""
        folder = pathlib.Path(bundle)
        files = []
        for k, x in enumerate(inputs):
            path = folder / f"input{k}.bin"
            np.ascontiguousarray(x).tofile(path)
            files.append(str(path))
        out = out or folder / "out"
        out.mkdir(exist_ok=True)
        for old in out.glob("*.bin"):
            old.unlink()
        command = [str(self.driver), self.plugin, bundle, *files, "--out", str(out)]
        if repeat:
            command += ["--repeat", str(repeat)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_PRELOAD"))}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        return done, outputs_of(bundle, out) if done.returncode == 0 else None


def outputs_of(bundle: str, out: pathlib.Path) -> list[np.ndarray]:
    import json

    manifest = json.loads((pathlib.Path(bundle) / "manifest.json").read_text())
    results = []
    for k, io in enumerate(manifest["outputs"]):
        dtype = np.dtype(io["dtype"]) if io["dtype"] != "bfloat16" else np.dtype("V2")
        results.append(np.fromfile(out / f"{k}.bin", dtype).reshape(io["shape"]))
    return results


def build_host(tmp_path_factory) -> Host:
    """demos/run_bundle.c built against the plugin's header and jaxbind's runtime (skips,
    saying what to install, where there is no plugin, header or C compiler)."""
    import pytest

    plugin, include, cc = plugin_path(), include_dir(), compiler()
    if plugin is None or include is None:
        pytest.skip(INSTALL)
    if cc is None:
        pytest.skip("no C compiler")
    return Host(compile_driver(cc, include, tmp_path_factory.mktemp("host")), plugin)


def compile_driver(cc: str, include: str, where: pathlib.Path) -> pathlib.Path:
    """demos/run_bundle.c compiled with `cc` against the PJRT header in `include` and
    jaxbind's runtime, into `where`; the driver's path."""
    import jaxbind

    runtime = jaxbind.runtime_library()
    driver = where / "run_bundle"
    subprocess.run(
        [
            cc,
            "-O2",
            str(ROOT / "demos" / "run_bundle.c"),
            f"-I{include}",
            f"-I{jaxbind.kernel_include_dir()}",
            runtime,
            f"-Wl,-rpath,{pathlib.Path(runtime).parent}",
            "-ldl",
            "-o",
            str(driver),
        ],
        check=True,
    )
    return driver


def build_library(tmp_path_factory, source: pathlib.Path) -> pathlib.Path:
    """A C file against jaxbind/kernel.h compiled into a shared library."""
    import pytest

    import jaxbind

    cc = compiler()
    if cc is None:
        pytest.skip("no C compiler")
    tmp = tmp_path_factory.mktemp("clib")
    so = tmp / f"lib{source.stem}.so"
    subprocess.run(
        [
            cc,
            "-O2",
            "-shared",
            "-fPIC",
            f"-I{jaxbind.kernel_include_dir()}",
            str(source),
            "-o",
            str(so),
        ],
        check=True,
    )
    return so
