"""Abstract functions and callables for small ops that a test makes for itself."""

import numpy as np

import jaxbind

# A CUDA kernel, y = a x over n elements, that the driver would load: the tests that lower
# CUDA kernels on a machine without a GPU never load it.
SCALE_PTX = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 y, .param .u64 x, .param .f32 a, .param .u64 n) { ret; }
"""


def same_as_first(x, *args, **kwargs):
    """The abstract function of one output shaped and typed as the first argument."""
    return ((x.shape, x.dtype),)


def same_as_last(*args, **kwargs):
    """The abstract function of one output shaped and typed as the last argument."""
    return ((args[-1].shape, args[-1].dtype),)


def double(out, args, kwargs_dump):
    """out = 2 x: linear, and its own transpose."""
    out[0][...] = 2 * args[0]


def doubling(name: str, **options):
    """The op out = 2 x of the 1.3 API (its own transpose), named `name`, with `options`."""
    return jaxbind.get_linear_call(
        double, double, same_as_first, same_as_first, name=name, **options
    )


def copy_last(out, args, kwargs_dump):
    """out = the last argument."""
    out[0][...] = args[-1]


def sine(out, args, kwargs_dump):
    """out = sin(x): nonlinear, elementwise."""
    (x,) = args
    out[0][...] = np.sin(x)


def sine_derivative(out, args, kwargs_dump):
    """The JVP and the VJP of sine alike: out = cos(x) t."""
    x, t = args
    out[0][...] = np.cos(x) * t


def simple_op(f, name, abstract=same_as_first):
    """A linear op of the callable `f` without a transpose, named `name`."""
    return jaxbind.get_linear_call(f, None, abstract, None, name=name)


def failing_setup(name: str):
    """An op (pytree API, y = x) whose state's setup raises RuntimeError("no plan today")."""

    @jaxbind.state
    def plan(*, scale):
        raise RuntimeError("no plan today")

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name)
    def op(x, *, state, scale):
        return x

    return op
