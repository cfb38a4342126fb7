"""Abstract functions and callables for small ops that a test makes for itself."""

import jaxbind


def same_as_first(x, *args, **kwargs):
    """The abstract function of one output shaped and typed as the first argument."""
    return ((x.shape, x.dtype),)


def same_as_last(*args, **kwargs):
    """The abstract function of one output shaped and typed as the last argument."""
    return ((args[-1].shape, args[-1].dtype),)


def double(out, args, kwargs_dump):
    """out = 2 x: linear, and its own transpose."""
    out[0][...] = 2 * args[0]


def copy_last(out, args, kwargs_dump):
    """out = the last argument."""
    out[0][...] = args[-1]


def simple_op(f, name, abstract=same_as_first):
    """A linear op of the callable `f` without a transpose, named `name`."""
    return jaxbind.get_linear_call(f, None, abstract, None, name=name)
