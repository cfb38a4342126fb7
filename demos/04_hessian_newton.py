"""Second derivatives through foreign code: a Newton step on a power-spectrum likelihood.

The data are noisy measurements of the power spectrum |FFT(x)|^2 of a real
signal x; we fit x with damped Newton steps on the negative log-likelihood. The
forward model is a nonlinear jaxbind op whose function runs DUCC's real FFT
directly (ducc0.fft.r2c), and whose JVP and VJP are JAX functions built
from jaxducc0.r2c, a linear jaxbind op that differentiates to any order. So the
op has exact second derivatives: jax.hessian of the negative log-likelihood works,
and a Newton step can use it. Everything is compared with the same computation in
pure JAX (jnp.fft.rfft).
"""

import time

import ducc0
import jax
import jax.numpy as jnp
import numpy as np

import jaxbind
from jaxbind.contrib import jaxducc0

jax.config.update("jax_enable_x64", True)

N, SIGMA = 64, 0.5


def _power(out, args, kwargs_dump):
    (x,) = args
    out[0][...] = np.abs(ducc0.fft.r2c(x)) ** 2


def power_jvp(x, dx):  # d|F x|^2 = 2 Re(conj(F x) F dx)
    fx, fdx = jaxducc0.r2c(x)[0], jaxducc0.r2c(dx)[0]
    return [2 * jnp.real(jnp.conj(fx) * fdx)]


def power_vjp(x, ct):  # the transpose of power_jvp in dx, in JAX
    (dx,) = jax.linear_transpose(lambda dx: power_jvp(x, dx)[0], x)(ct)
    return [dx]


power = jaxbind.get_nonlinear_call(
    _power,
    (jaxbind.jax_function(power_jvp), jaxbind.jax_function(power_vjp)),
    lambda x: (((x.shape[0] // 2 + 1,), x.dtype),),
    lambda x, ct: ((x.shape, x.dtype),),
    name="demo.power_spectrum",
)


# The same op with the pytree API: the derivatives are jaxbind.jax_functions
# with JAX's (primals, tangents) / (primals, cotangent) signatures.
@jaxbind.nonlinear_op(
    shape=lambda x: jax.ShapeDtypeStruct((x.shape[0] // 2 + 1,), x.dtype),
    name="demo.power_spectrum_native",
)
def power_native(x):
    return np.abs(ducc0.fft.r2c(x)) ** 2


power_native.def_jvp(
    jaxbind.jax_function(lambda primals, tangents: power_jvp(primals[0], tangents[0])[0])
)
power_native.def_vjp(jaxbind.jax_function(lambda primals, ct: tuple(power_vjp(primals[0], ct))))


def neg_log_likelihood(x, data, spectrum):
    residual = (data - spectrum(x)) / SIGMA
    return 0.5 * jnp.sum(residual**2) + 0.5 * jnp.sum(x**2)  # Gaussian noise and prior


def with_jaxbind(x):
    return power(x)[0]


def with_jax(x):
    return jnp.abs(jnp.fft.rfft(x)) ** 2


def main():
    rng = np.random.default_rng(42)
    truth = rng.standard_normal(N) * 0.3
    data = np.asarray(with_jax(truth)) + SIGMA * rng.standard_normal(N // 2 + 1)
    x0 = truth + 0.05 * rng.standard_normal(N)

    jaxbind.testing.check(power, x0, verbose=False)  # includes the second-order checks

    results = {}
    for name, spectrum in (("jaxbind", with_jaxbind), ("pure JAX", with_jax)):
        loss = lambda x, s=spectrum: neg_log_likelihood(x, data, s)
        grad, hess = jax.jit(jax.grad(loss)), jax.jit(jax.hessian(loss))

        @jax.jit
        def newton(x, damping, grad=grad, hess=hess):  # a damped (Levenberg-Marquardt) step
            return x - jnp.linalg.solve(hess(x) + damping * jnp.eye(N), grad(x))

        hess(x0).block_until_ready()
        start = time.perf_counter()
        for _ in range(20):
            h = hess(x0).block_until_ready()
        t_hess = (time.perf_counter() - start) / 20
        x, damping, losses = x0, 1.0, [float(loss(x0))]
        for _ in range(8):
            trial = newton(x, damping)
            if float(loss(trial)) < losses[-1]:
                x, damping = trial, damping / 3
                losses.append(float(loss(x)))
            else:
                damping *= 10
        results[name] = dict(
            H=np.asarray(h),
            x=np.asarray(x),
            losses=losses,
            t_hess=t_hess,
            min_eig=float(np.linalg.eigvalsh(np.asarray(h))[0]),
        )

    # the pytree-API op: same Hessian, same primitive
    loss_native = lambda x: neg_log_likelihood(x, data, power_native)
    h_native = np.asarray(jax.jit(jax.hessian(loss_native))(x0))
    err_native = np.max(np.abs(h_native - results["jaxbind"]["H"])) / np.max(np.abs(h_native))
    names = {
        str(e.primitive)
        for e in jax.make_jaxpr(lambda x: (with_jaxbind(x), power_native(x)))(x0).eqns
    }
    assert err_native < 1e-12 and names == {"jaxbind"}, (err_native, names)
    print(f"pytree-API op's Hessian vs the JAXbind-protocol op's: relative error {err_native:.1e}")

    ours, ref = results["jaxbind"], results["pure JAX"]
    err_h = np.max(np.abs(ours["H"] - ref["H"])) / np.max(np.abs(ref["H"]))
    err_x = np.max(np.abs(ours["x"] - ref["x"])) / np.max(np.abs(ref["x"]))
    print(
        f"Hessian ({N}x{N}) through DUCC vs pure JAX: relative error {err_h:.1e} "
        f"(smallest eigenvalue {ours['min_eig']:.2f}: not convex, hence the damping)"
    )
    print(f"damped Newton iterates vs pure JAX:        relative error {err_x:.1e}")
    print(
        "negative log-likelihood:                  "
        + " -> ".join(f"{v:.2f}" for v in ours["losses"])
    )
    print(
        f"jit(hessian) per call: jaxbind {ours['t_hess'] * 1e3:.2f} ms, "
        f"pure JAX {ref['t_hess'] * 1e3:.2f} ms"
    )
    assert err_h < 1e-10 and err_x < 1e-8
    assert ours["losses"] == ref["losses"] or np.allclose(ours["losses"], ref["losses"])
    assert ours["losses"][-1] < ours["losses"][0]


if __name__ == "__main__":
    main()
