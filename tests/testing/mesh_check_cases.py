"""jaxbind.testing.check(mesh=) on 4 CPU devices (see test_testing_mesh.py): forward mode
(JVPs) split by the op's rule against one device, beside the values and reverse mode.

``python mesh_check_cases.py [case ...]`` runs the cases and prints one JSON line per
case: {"case", "ok", "detail"}. The device-count flag is set here, before JAX is imported.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import sys

import jax
import numpy as np
from jax.sharding import Mesh
from support.ops import sine, sine_derivative
from support.processes import run_case_functions

import jaxbind

jax.config.update("jax_enable_x64", True)

M = 256  # points: 64 on each device
mesh = Mesh(np.array(jax.devices()), ("p",))


def _sine_jvp_of_the_whole(out, args, kwargs_dump):
    # Normalised by the length it expects: right on all M points, 4x off on a device's M/4.
    x, t = args
    out[0][...] = np.cos(x) * t * (x.shape[0] / M)


def _sine_op(jvp, name):
    return jaxbind.get_nonlinear_call(
        sine,
        (jvp, sine_derivative),
        lambda x: ((x.shape, x.dtype),),
        lambda x, t: ((x.shape, x.dtype),),
        name=name,
        sharding="m -> m",
    )


def _points():
    return np.random.default_rng(0).uniform(-3, 3, M)


def case_check_compares_forward_mode_on_a_mesh():
    op = _sine_op(sine_derivative, "mesh_check.sine")
    report = jaxbind.testing.check(op, _points(), mesh=mesh, verbose=False)
    (row,) = [r for r in report if r.check == "mesh jvp vs one device"]
    assert row.ok and row.target == "m over 'p': argument 0 -> output 0", row
    (found,) = [r for r in report if r.check == "collectives on a mesh"]
    assert found.ok and "jvp: none" in found.detail, found
    return found.detail


def case_check_fails_a_jvp_right_only_on_the_whole_array():
    op = _sine_op(_sine_jvp_of_the_whole, "mesh_check.sine_jvp_of_the_whole")
    x = _points()
    tangent = np.ones(M)
    assert np.allclose(jax.jvp(lambda x: op(x)[0], (x,), (tangent,))[1], np.cos(x))
    try:
        jaxbind.testing.check(op, x, mesh=mesh, verbose=False)
    except AssertionError as exc:
        text = str(exc)
    else:
        raise AssertionError("check passed a JVP that is wrong on a device's part")
    assert "failed 1 check(s)" in text, text
    assert "- mesh jvp vs one device [m over 'p': argument 0 -> output 0" in text, text
    return text.splitlines()[1]


if __name__ == "__main__":
    run_case_functions(globals(), sys.argv[1:], limit=8)
