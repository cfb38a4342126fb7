"""The forms of forms.py written once per kind of body, and built into ops of either API.

`build(kind, api, form)` makes the op of one row of the matrix. Its roles are computed by
formulas common to every kind (`S` = base * c):

  scale       out0 = S in0                        linear f and T
  square      out0 = S in0 in0                    nonlinear f (float and complex forms)
  slope       out0 = 2 S in0 in1                  their JVP and VJP
  keyed       out0 = S in0 in1; out1 = g(in1)     f of int32 (g = 2k+1) and bool (g = not m)
  keyed_d     out0 = S in2 in1; out1 = 0          their JVP and VJP
  mixed       out0 = S in0 in0; out1 = floor in0; out2 = in0 > 0
  mixed_jvp   out0 = 2 S in0 in1; out1 = out2 = 0
  mixed_vjp   out0 = 2 S in0 in1
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from support.ops import SCALE_PTX

import jaxbind

from .forms import BASE, FORMS, Form

C_VALUE = 1.5  # the static keyword argument c of every call


# --- which formula computes each role of each form ---------------------------------------
def formulas(form: Form) -> dict[str, str]:
    """Role -> formula (see the module's text)."""
    if form.linear:
        return {"f": "scale", "T": "scale"}
    if form.name in ("int32", "bool"):
        return {"f": "keyed", "jvp": "keyed_d", "vjp": "keyed_d"}
    if form.name == "mixed":
        return {"f": "mixed", "jvp": "mixed_jvp", "vjp": "mixed_vjp"}
    return {"f": "square", "jvp": "slope", "vjp": "slope"}


def numpy_formula(formula: str, form: Form, ins, s: float) -> tuple:
    """A formula by NumPy (the callable bodies), outputs in the role's dtypes, each shaped as
    the inputs broadcast together (a vectorized op's inputs may be batched or not)."""
    shape = np.broadcast_shapes(*(np.shape(i) for i in ins))
    return tuple(np.broadcast_to(o, shape) for o in _numpy_formula(formula, form, ins, s))


def _numpy_formula(formula: str, form: Form, ins, s: float) -> tuple:
    if formula == "scale":
        return (s * ins[0],)
    if formula == "square":
        return (s * ins[0] * ins[0],)
    if formula == "slope":
        return (2 * s * ins[0] * ins[1],)
    if formula == "keyed":
        x, k = ins
        z = 2 * k + 1 if form.name == "int32" else np.logical_not(k)
        return (np.asarray(s * x * k, np.float32), z)
    if formula == "keyed_d":
        x, k, t = ins[:3]
        return (np.asarray(s * t * k, np.float32), np.zeros_like(k))
    x = ins[0]
    if formula == "mixed":
        return (s * x * x, np.floor(x).astype(np.int32), x > 0)
    d = 2 * s * x * ins[1]
    if formula == "mixed_jvp":
        return (d, np.zeros(x.shape, np.int32), np.zeros(x.shape, bool))
    return (d,)


def jax_formula(formula: str, form: Form, ins, s: float) -> tuple:
    """A formula by JAX (the JAX-function bodies)."""
    if formula == "keyed":
        x, k = ins
        z = 2 * k + 1 if form.name == "int32" else jnp.logical_not(k)
        return (s * x * k.astype(x.dtype), z)
    if formula == "keyed_d":
        x, k, t = ins[:3]
        return (s * t * k.astype(t.dtype), jnp.zeros_like(k))
    if formula == "mixed":
        x = ins[0]
        return (s * x * x, jnp.floor(x).astype(jnp.int32), x > 0)
    if formula == "mixed_jvp":
        x, t = ins
        return (2 * s * x * t, jnp.zeros(x.shape, jnp.int32), jnp.zeros(x.shape, bool))
    return _numpy_formula(formula, form, ins, s)  # elementwise arithmetic: the same text


# --- numba: one function per formula, key dtype and base ---------------------------------
@functools.cache
def numba_kernel(formula: str, form_name: str, base: float):
    b = base
    if formula == "scale":

        def fn(y, x, c):
            for i in range(y.size):
                y.flat[i] = b * c * x.flat[i]
    elif formula == "square":

        def fn(y, x, c):
            for i in range(y.size):
                y.flat[i] = b * c * x.flat[i] * x.flat[i]
    elif formula == "slope":

        def fn(y, x, t, c):
            for i in range(y.size):
                y.flat[i] = 2 * b * c * x.flat[i] * t.flat[i]
    elif formula == "keyed" and form_name == "int32":

        def fn(y, z, x, k, c):
            for i in range(y.size):
                y.flat[i] = b * c * x.flat[i] * k.flat[i]
                z.flat[i] = 2 * k.flat[i] + 1
    elif formula == "keyed":

        def fn(y, z, x, k, c):
            for i in range(y.size):
                y.flat[i] = b * c * x.flat[i] * k.flat[i]
                z.flat[i] = not k.flat[i]
    elif formula == "keyed_d":

        def fn(y, z, x, k, t, tk, c):
            for i in range(y.size):
                y.flat[i] = b * c * t.flat[i] * k.flat[i]
                z.flat[i] = 0
    elif formula == "mixed":

        def fn(y, fl, p, x, c):
            for i in range(y.size):
                y.flat[i] = b * c * x.flat[i] * x.flat[i]
                fl.flat[i] = np.floor(x.flat[i])
                p.flat[i] = x.flat[i] > 0
    elif formula == "mixed_jvp":

        def fn(y, fl, p, x, t, c):
            for i in range(y.size):
                y.flat[i] = 2 * b * c * x.flat[i] * t.flat[i]
                fl.flat[i] = 0
                p.flat[i] = False
    else:  # mixed_vjp: the cotangents of the integer and boolean outputs are not read

        def fn(y, x, t, t1, t2, c):
            for i in range(y.size):
                y.flat[i] = 2 * b * c * x.flat[i] * t.flat[i]

    return jaxbind.kernel(fn)


# --- C: one function per formula, form and base, generated -------------------------------
_C_TYPES = {
    "float32": "float",
    "float64": "double",
    "complex64": "float complex",
    "complex128": "double complex",
    "int32": "int32_t",
    "bool": "uint8_t",
}

_C_PRELUDE = r"""
#include <complex.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "jaxbind/kernel.h"

static double kwarg_c(const jaxbind_call *call) {
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, "c") == 0)
      return call->kwargs[k].type == JAXBIND_KWARG_FLOAT ? call->kwargs[k].float_value
                                                         : (double)call->kwargs[k].int_value;
  return 1.0;
}
/* The body of the kinds that run on a GPU only (jaxbind.kernel(platform="cuda")): on this
   CPU their cells run the reference, or are refused, so nothing calls it; on a GPU it
   fails, saying so, rather than read device memory. */
int32_t stand_in_for_cuda(const jaxbind_call *call) {
  snprintf(call->error, (size_t)call->error_size,
           "the conformance matrix's stand-in for a kernel for CUDA computes nothing");
  return 1;
}
static int64_t count(const jaxbind_buffer *b) {
  int64_t n = 1;
  for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d];
  return n;
}
"""


def c_name(formula: str, form: Form, base: float) -> str:
    return f"{formula}_{form.name}_{'lin' if form.linear else 'nl'}_{int(base * 10)}"


def _c_function(formula: str, form: Form, base: float) -> str:
    t0 = _C_TYPES[form.inputs[0]]
    key = _C_TYPES[form.inputs[1]] if len(form.inputs) > 1 else ""
    body = {
        "scale": "y0[i] = S * in0[i];",
        "square": "y0[i] = S * in0[i] * in0[i];",
        "slope": "y0[i] = 2 * S * in0[i] * in1[i];",
        "keyed": "y0[i] = S * in0[i] * in1[i]; y1[i] = "
        + ("2 * in1[i] + 1;" if form.name == "int32" else "!in1[i];"),
        "keyed_d": "y0[i] = S * in2[i] * in1[i]; y1[i] = 0;",
        "mixed": "y0[i] = S * in0[i] * in0[i]; y1[i] = (int32_t)floor(in0[i]); y2[i] = in0[i] > 0;",
        "mixed_jvp": "y0[i] = 2 * S * in0[i] * in1[i]; y1[i] = 0; y2[i] = 0;",
        "mixed_vjp": "y0[i] = 2 * S * in0[i] * in1[i];",
    }[formula]
    # the arrays each formula reads and writes, with their C types
    types = {
        "scale": ([t0], [t0]),
        "square": ([t0], [t0]),
        "slope": ([t0, t0], [t0]),
        "keyed": ([t0, key], [t0, key]),
        "keyed_d": ([t0, key, t0], [t0, key]),
        "mixed": ([t0], [t0, "int32_t", "uint8_t"]),
        "mixed_jvp": ([t0, t0], [t0, "int32_t", "uint8_t"]),
        "mixed_vjp": ([t0, t0], [t0]),
    }[formula]
    ins, outs = types
    lines = [f"int32_t {c_name(formula, form, base)}(const jaxbind_call *call) {{"]
    lines.append(f"  const double S = {base!r} * kwarg_c(call);")
    lines.append("  const int64_t n = count(&call->outputs[0]);")
    for j, t in enumerate(ins):
        lines.append(f"  const {t} *in{j} = (const {t} *)call->inputs[{j}].data;")
    for j, t in enumerate(outs):
        lines.append(f"  {t} *y{j} = ({t} *)call->outputs[{j}].data;")
    lines.append(f"  for (int64_t i = 0; i < n; ++i) {{ {body} }}")
    lines.append("  return 0;\n}")
    return "\n".join(lines)


@functools.cache
def c_library() -> ctypes.CDLL:
    """Every C function of every form, role and base, compiled once per process."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler")
    functions = []
    for form in FORMS.values():
        for formula in dict.fromkeys(formulas(form).values()):
            for base in (BASE, 3.0):
                functions.append(_c_function(formula, form, base))
    where = Path(tempfile.mkdtemp(prefix="jaxbind-conformance-"))
    (where / "k.c").write_text(_C_PRELUDE + "\n\n".join(functions))
    so = where / "libconformance.so"
    include = f"-I{jaxbind.kernel_include_dir()}"
    subprocess.run(
        [cc, "-O1", "-shared", "-fPIC", include, str(where / "k.c"), "-o", str(so)], check=True
    )
    return ctypes.CDLL(str(so))


# --- one op of the matrix ------------------------------------------------------------------
@dataclass
class Built:
    """An op of the matrix: `call(*xs)` gives its outputs as a tuple (either API)."""

    op: object
    api: str
    form: Form
    base: float
    has_reference: bool
    calls: list  # one entry per call of a Python body (the "callable" and "jax" kinds' f)

    def call(self, *xs, c: float = C_VALUE):
        out = self.op(*xs, c=c)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)


def _reference(form: Form, base: float, api: str):
    def reference(*xs, c):
        outs = form.twin(*xs, c=c, base=base)
        if api == "native":
            return outs if len(outs) > 1 else outs[0]
        return list(outs)

    return reference


def _callable_13(formula, form, base, calls=None):
    def body(out, args, kwargs_dump):
        if calls is not None:
            calls.append(1)
        c = jaxbind.load_kwargs(kwargs_dump)["c"]
        for o, r in zip(out, numpy_formula(formula, form, args, base * c)):
            o[...] = r

    return body


def _jaxfn_13(formula, form, base):
    return jaxbind.jax_function(lambda *ins, c: list(jax_formula(formula, form, ins, base * c)))


def _kernel(kind, formula, form, base):
    if kind == "numba":
        return numba_kernel(formula, form.name, base)
    if kind == "c":
        return jaxbind.kernel(getattr(c_library(), c_name(formula, form, base)))
    if kind in ("stream", "graph_safe"):
        return jaxbind.kernel(
            c_library().stand_in_for_cuda, platform="cuda", graph_safe=kind == "graph_safe"
        )
    return jaxbind.cuda_kernel(SCALE_PTX, "scale", scalars=lambda *a, **k: ())


def _bodies_13(kind, form, base, calls):
    """Role -> body in the JAXbind 1.3 API's protocol (None: not given, derived)."""
    roles = formulas(form)
    if kind in ("callable", "jax", "derived"):
        out = {"f": _callable_13(roles["f"], form, base, calls)}
        for role, formula in roles.items():
            if role != "f" and kind == "callable":
                out[role] = _callable_13(formula, form, base)
            elif role != "f" and kind == "jax":
                out[role] = _jaxfn_13(formula, form, base)
        return out
    return {role: _kernel(kind, formula, form, base) for role, formula in roles.items()}


def _abstract(dtypes):
    return lambda *args, **kw: tuple(((args[0].shape), np.dtype(d)) for d in dtypes)


def build(
    kind: str, api: str, form_key: str, *, name: str, base: float = BASE, replace=False,
    options=None, reference=None,
):  # fmt: skip
    """The op of one row: kind of body × API × form, named `name` (`reference`: another
    reference than the form's twin)."""
    form = FORMS[form_key]
    calls: list = []
    with_reference = not kind.endswith("_noref")
    body_kind = kind.removesuffix("_noref")
    bodies = _bodies_13(body_kind, form, base, calls)
    if reference is None and with_reference:
        reference = _reference(form, base, api)
    options = {"name": name, "replace": replace, **(options or {})}
    if api == "jaxbind13":
        if form.linear:
            op = jaxbind.get_linear_call(
                bodies["f"], bodies.get("T"), _abstract(form.outputs), _abstract(form.inputs),
                reference=reference, **options,
            )  # fmt: skip
        else:
            derivs = (bodies.get("jvp"), bodies.get("vjp"))
            op = jaxbind.get_nonlinear_call(
                bodies["f"], derivs, _abstract(form.outputs), _abstract(form.inputs),
                reference=reference, **options,
            )  # fmt: skip
        return Built(op, api, form, base, with_reference, calls)
    return Built(_pytree_api(body_kind, form, base, calls, reference, options), api, form, base,
                 with_reference, calls)  # fmt: skip


def _sds(dtypes, like):
    out = tuple(jax.ShapeDtypeStruct(like.shape, np.dtype(d)) for d in dtypes)
    return out if len(out) > 1 else out[0]


def _pytree_api(kind, form, base, calls, reference, options):
    """The op in the pytree API: callables return their results; kernels as they are."""
    roles = formulas(form)
    shape = lambda *xs, c: _sds(form.outputs, xs[0])
    decorator = jaxbind.linear_op if form.linear else jaxbind.nonlinear_op

    def one(res):
        return res if len(res) > 1 else res[0]

    if kind in ("callable", "jax", "derived"):

        def f(*xs, c):
            calls.append(1)
            return one(numpy_formula(roles["f"], form, xs, base * c))

        op = decorator(shape=shape, reference=reference, **options)(f)
        if kind == "derived":
            return op
        wrap = jaxbind.jax_function if kind == "jax" else (lambda fn: fn)
        lib = jax_formula if kind == "jax" else numpy_formula
        if form.linear:
            op.def_transpose(wrap(lambda ct, *, c: lib("scale", form, (ct,), base * c)[0]))
            return op

        def as_tuple(v):
            return tuple(v) if isinstance(v, (tuple, list)) else (v,)

        op.def_jvp(wrap(lambda p, t, *, c: one(lib(roles["jvp"], form, (*p, *t), base * c))))
        op.def_vjp(
            wrap(
                lambda p, ct, *, c: lib(roles["vjp"], form, (*p, *as_tuple(ct)), base * c)[: len(p)]
            )
        )
        return op
    kernels = {role: _kernel(kind, formula, form, base) for role, formula in roles.items()}
    op = decorator(shape=shape, reference=reference, **options)(kernels["f"])
    if form.linear:
        op.def_transpose(kernels["T"])
    else:
        op.def_jvp(kernels["jvp"])
        op.def_vjp(kernels["vjp"])
    return op
