"""What a user reads outside the docs site: help(jaxbind) and the docstrings of public names.

The site links names with mkdocstrings' markup (``[`Op`][jaxbind.Op]``); help() and IDEs
show docstrings as text, where that markup is noise.
"""

import importlib.util
import inspect
import pydoc
import re

import pytest

import jaxbind

CROSS_REFERENCE = re.compile(r"\[[^\[\]]+\]\[(?:[A-Za-z_][\w.]*)?\]")


def _public():
    """(name, object) of every public name, and of the members of public classes."""
    modules = [("jaxbind", jaxbind), ("jaxbind.testing", jaxbind.testing)]
    if importlib.util.find_spec("ducc0") is not None:
        from jaxbind.contrib import jaxducc0

        modules.append(("jaxbind.contrib.jaxducc0", jaxducc0))
    for prefix, module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            yield f"{prefix}.{name}", obj
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if not member.startswith("_") and getattr(value, "__doc__", None):
                        yield f"{prefix}.{name}.{member}", value


def test_docstrings_of_public_names_have_no_cross_reference_markup():
    marked = {
        name: CROSS_REFERENCE.findall(obj.__doc__)
        for name, obj in _public()
        if isinstance(getattr(obj, "__doc__", None), str) and CROSS_REFERENCE.search(obj.__doc__)
    }
    assert not marked, marked


def test_plain_docstrings_keep_code_that_looks_like_markup():
    assert "out[0][...] = ..." in jaxbind.get_linear_call.__doc__


def test_help_groups_the_package_by_what_things_are():
    text = pydoc.render_doc(jaxbind, renderer=pydoc.plaintext)
    description = text.split("PACKAGE CONTENTS")[0]
    assert not CROSS_REFERENCE.search(description)
    groups = [
        "The pytree API",
        "The JAXbind 1.3 API",
        "Compiled kernels",
        "Export",
        "GPU (CUDA",
        "Testing",
        "Contrib",
    ]
    at = [description.find(group) for group in groups]
    assert -1 not in at and at == sorted(at), dict(zip(groups, at))
    # each group names its own things, and not another's
    native = description[at[0] : at[1]]
    assert "linear_op" in native and "get_linear_call" not in native
    calls = description[at[1] : at[2]]
    assert "get_linear_call" in calls and "kernel" not in calls and "export" not in calls


@pytest.mark.parametrize("name", sorted(set(jaxbind.__all__) - {"__version__"}))
def test_help_names_every_public_name(name):
    assert re.search(rf"\b{name}\b", jaxbind.__doc__), name


@pytest.mark.parametrize(
    "api",
    ["linear_op", "multilinear_op", "nonlinear_op", "get_linear_call", "get_nonlinear_call"],
)
def test_every_option_is_documented_in_each_ops_help(api):
    """A new option cannot be left out of help(): each way to make an op lists them all."""
    from jaxbind._options import OPTION_NAMES

    doc = getattr(jaxbind, api).__doc__
    names = (*OPTION_NAMES, "fixed", "vectorized", "name", "replace")
    if api.startswith("get_"):
        names += ("first_n_args_fixed", "func_can_batch")
    missing = [name for name in names if f"``{name}``" not in doc]
    assert not missing, f"help(jaxbind.{api}) does not mention {missing}"
