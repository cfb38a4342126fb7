"""The table of calls run under JAXbind 1.3.1 and under jaxbind (test_jaxbind13.py).

Data only: each `Row` names a program of worker.py and gives it plain data (the options,
arguments and keyword arguments as real code passes them: Python and NumPy bools,
integers and floats, lists, None). JAXbind 1.3.1 decides what must be accepted:

- ``SAME`` (most rows): where 1.3.1 accepts the call, jaxbind accepts it too, with the
  same results (to ``rtol``) and the same keyword arguments seen by the callables. Where
  1.3.1 refuses it, jaxbind may refuse it or accept it.
- ``WRONG13`` rows: jaxbind refuses a call that 1.3.1 accepted, because 1.3.1's result
  was wrong; ``why`` says how, and jaxbind's message must match ``match`` (it says why).
- ``pending``: a known difference that another change of issue 46 removes; the row is
  reported as an expected failure until it passes.
- ``DIFFERS13`` rows: both accept the call, and their results (or the keyword arguments
  the callables saw) differ, because 1.3.1's were silently wrong (``why``); jaxbind's are
  checked elsewhere (tests/contrib, tests/runtime/test_floats.py).

Its spaces of parameter values (hypothesis draws from them, test_jaxbind13.py) are here
too: `INTS`, `BOOLS`, ... list how real code spells one value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SAME = "same"
WRONG13 = "jaxbind refuses because 1.3.1 was wrong"
DIFFERS13 = "jaxbind's results differ because 1.3.1's were wrong"


@dataclass(frozen=True)
class Row:
    id: str
    program: str
    params: dict = field(default_factory=dict)
    expect: str = SAME
    why: str = ""  # WRONG13: what 1.3.1 did wrong
    match: str = ""  # WRONG13: a regex that jaxbind's message matches
    rtol: float = 1e-12
    pending: str = ""  # a known difference that another change removes: an expected failure

    def __post_init__(self):
        assert self.expect in (SAME, WRONG13, DIFFERS13), self.id
        assert self.expect == SAME or self.why, self.id
        assert self.expect != WRONG13 or self.match, self.id

    @property
    def wire(self):
        """What the workers are sent."""
        return (self.id, self.program, self.params)


_rng = np.random.default_rng(46)


def _real(*shape):
    return _rng.normal(size=shape)


def _complex(*shape):
    return _rng.normal(size=shape) + 1j * _rng.normal(size=shape)


# --- how real code spells one value -----------------------------------------------------


# The integer n as real code spells it, each spelling that 1.3.1 passed on (to DUCC, or to
# Python's arithmetic): an int, a NumPy integer, a float, a bool. The table takes one
# NumPy integer type; hypothesis draws from all of them (all_ints).
def ints(n: int) -> list:
    return [n, np.int64(n), float(n), np.float64(n)] + (
        [bool(n), np.bool_(n)] if n in (0, 1) else []
    )


def all_ints(n: int) -> list:
    return ints(n) + [np.int32(n), np.uint8(n), np.int16(n), np.uint64(n)]


BOOLS = [True, False, 1, 0, np.True_, np.False_, None]


def floats(x: float) -> list:
    return [x, np.float64(x), np.float32(x)] + ([int(x)] if float(x).is_integer() else [])


# --- the core API: get_linear_call, get_nonlinear_call, load_kwargs ----------------------

X = _real(2, 3)
DERIVATIVES = dict(tangent=_real(2, 3), cotangent=_real(2, 3))
CORE_TRANSFORMS = ("call", "jit", "vmap", "jvp", "vjp", "transpose", "grad")
NONLINEAR_TRANSFORMS = ("call", "jit", "vmap", "jvp", "vjp", "grad")


def _core(id, api, options, transforms, nfixed=0, **extra):
    rows = []
    for t in transforms:
        params = dict(api=api, nfixed=nfixed, options=options, transform=t, **DERIVATIVES)
        params.setdefault("args", [np.float64(0.5)] * nfixed + [X])
        params.update(extra)
        rows.append(Row(f"{id}:{t}", "core", params))
    return rows


def _fixed_rows():
    rows = []
    # every transformation with the plain int; the ones that read the count with the others
    for api, transforms, reading in (
        ("linear", CORE_TRANSFORMS, ("call", "jvp", "transpose")),
        ("nonlinear", NONLINEAR_TRANSFORMS, ("call", "vjp")),
    ):
        for n in (0, 1, 2):
            for value in ints(n) + ([None] if n == 0 else []):
                rows += _core(
                    f"{api} first_n_args_fixed={value!r}",
                    api,
                    dict(first_n_args_fixed=value),
                    transforms if type(value) is int else reading,
                    nfixed=n,
                )
    bad = [
        (1.5, "a count of 1.5 arguments", "first_n_args_fixed must be"),
        (-1, "a negative count", "first_n_args_fixed must be"),
        ("1", "a string", "first_n_args_fixed must be"),
    ]
    for value, what, match in bad:
        for t in ("call", "vmap"):
            rows.append(
                Row(
                    f"linear first_n_args_fixed={value!r}:{t}",
                    "core",
                    dict(
                        api="linear",
                        nfixed=1,
                        options=dict(first_n_args_fixed=value),
                        transform=t,
                        args=[np.float64(0.5), X],
                    ),
                    expect=WRONG13,
                    why=f"1.3.1 never read first_n_args_fixed ({what}) before a derivative, "
                    "and every derivative then failed (TypeError or AssertionError)",
                    match=match + r".*JAXbind 1\.3",
                )
            )
    return rows


def _batching_rows():
    rows = []
    for value in BOOLS + ["yes", 2]:
        rows += _core(
            f"linear func_can_batch={value!r}",
            "linear",
            dict(func_can_batch=value),
            ("vmap",),
            in_axis=1 if value is True else 0,
        )
        if value in (True, False, None):
            rows += _core(
                f"nonlinear func_can_batch={value!r}",
                "nonlinear",
                dict(func_can_batch=value, first_n_args_fixed=1),
                ("vmap", "grad"),
                nfixed=1,
            )
    return rows


def _calling_convention_rows():
    rows = []
    rows += _core(
        "linear abstract_T by keyword", "linear", {}, ("call", "transpose"), abstract_T_keyword=True
    )
    rows += _core(
        "nonlinear abstract_reverse by keyword",
        "nonlinear",
        {},
        ("call", "vjp"),
        abstract_T_keyword=True,
    )
    rows += _core(
        "nonlinear derivatives as a list", "nonlinear", {}, NONLINEAR_TRANSFORMS, sequence="list"
    )
    for seq in ("tuple", "list"):
        for t in ("call", "jit", "jvp", "vjp", "transpose", "vmap"):
            rows.append(
                Row(
                    f"multilinear f_T as a {seq}:{t}",
                    "core",
                    dict(
                        api="multilinear",
                        sequence=seq,
                        args=[_real(2, 3), X],
                        transform=t,
                        diff=0,
                        **DERIVATIVES,
                    ),
                )
            )
    # positional arguments as real code passes them
    for what, arg in (
        ("a NumPy float64 array", X),
        ("a NumPy float32 array", X.astype(np.float32)),
        ("a Python float", 1.5),
        ("a NumPy scalar", np.float64(1.5)),
        ("a 0-d array", np.array(1.5)),
        ("a list", [1.0, 2.0]),
        ("a complex array", _complex(2, 3)),
        ("an int array", np.arange(6).reshape(2, 3)),
    ):
        for t in ("call", "jit"):
            rows += _core(f"linear argument {what}", "linear", {}, (t,), args=[arg])
    return rows


# Keyword arguments of a call: each with the types and values that callables get back.
KWARG_VALUES = {
    "int": 3,
    "float": 2.5,
    "bool": True,
    "None": None,
    "str": "ring",
    "bytes": b"raw",
    "complex": 1 + 2j,
    "tuple": (1, 2.0, "x"),
    "nested tuple": ((1, 2), (3,)),
    "empty tuple": (),
    "np.int64": np.int64(7),
    "np.int32": np.int32(7),
    "np.bool_": np.True_,
    "np.float64": np.float64(0.25),
    "np.float32": np.float32(0.25),
    "np.complex128": np.complex128(1 - 1j),
    "frozenset": frozenset({1, 2}),
    "large int": 2**70,
    "nan": float("nan"),
    "inf": float("inf"),
    "list": [1, 2],
    "dict": {"a": 1},
    "ndarray": np.arange(3),
}


SUBNORMAL = (
    "1.3.1 unpickled keyword arguments on XLA's threads, whose floating-point mode flushes "
    "subnormals to zero: its callable saw -0.0 for -2.2e-309; jaxbind's sees the value, and "
    "runs bodies with IEEE floats, as Python does (cpp/floats.h, tests/runtime/test_floats.py)"
)


def _kwargs_rows():
    rows = []
    for what, value in KWARG_VALUES.items():
        rows += [
            Row(r.id, r.program, r.params)
            for r in _core(
                f"kwarg {what}", "linear", {}, ("call", "transpose"), kwargs={"k": value}
            )
        ]
    rows += [
        Row(r.id, r.program, r.params, expect=DIFFERS13, why=SUBNORMAL)
        for r in _core(
            "kwarg subnormal float", "linear", {}, ("call",), kwargs={"k": -2.225073858507203e-309}
        )
    ]
    rows += _core(
        "kwargs of every kind",
        "linear",
        {},
        ("jit", "vmap"),
        kwargs={
            k.replace(" ", "_").replace(".", "_"): v
            for k, v in KWARG_VALUES.items()
            if k not in ("list", "dict", "ndarray")
        },
    )
    rows += _core(
        "kwargs with vectorized batching",
        "linear",
        dict(func_can_batch=True),
        ("call", "vmap"),
        kwargs=dict(nthreads=2, epsilon=1e-6, flip=False, name="x"),
    )
    for what, value in {
        "plain": dict(a=1, b="x"),
        "nested": dict(a=[1, {"b": (2, 3)}], c=np.arange(3)),
        "numpy": dict(a=np.float64(1.5), b=np.int64(2)),
        "empty": {},
    }.items():
        rows.append(Row(f"load_kwargs of a 1.3 dump: {what}", "load_kwargs", dict(kwargs=value)))
    return rows


# --- jaxducc0: c2c, genuine_fht ----------------------------------------------------------

C = _complex(4, 6)
R = _real(4, 6)
FFT_TRANSFORMS = ("call", "jit", "vmap", "transpose", "jvp", "grad")


def _fft(id, op, kwargs, transforms=FFT_TRANSFORMS, x=None, **extra):
    x = (C if op == "c2c" else R) if x is None else x
    return [
        Row(
            f"{op} {id}:{t}",
            "fft",
            dict(
                op=op,
                x=x,
                kwargs=kwargs,
                transform=t,
                cotangent=x,
                tangent=x,
                check_input_intact=True,
                **extra,
            ),
        )
        for t in transforms
    ]


def _fft_rows():
    rows = []
    for op in ("c2c", "genuine_fht"):
        rows += _fft("plain", op, {})
        for axes in (
            None,
            0,
            1,
            -1,
            np.int64(1),
            (0,),
            (1,),
            (0, 1),
            (1, 0),
            [0],
            [1, 0],
            (-1,),
            (np.int64(0),),
            (),
        ):
            rows += _fft(f"axes={axes!r}", op, dict(axes=axes), ("call", "transpose"))
        spelled = (lambda n: ints(n)) if op == "c2c" else (lambda n: ints(n)[:2])
        for inorm in spelled(0) + spelled(1) + spelled(2) + [3]:
            rows += _fft(f"inorm={inorm!r}", op, dict(inorm=inorm), ("call",))
        for nthreads in spelled(1) + spelled(2) + [0, -1]:
            rows += _fft(f"nthreads={nthreads!r}", op, dict(nthreads=nthreads), ("call",))
        for name, value in (
            ("allow_overwriting_input", True),
            ("out", None),
            ("forward", True),
            ("bogus", 1),
        ):
            rows += _fft(f"passed on: {name}={value!r}", op, {name: value}, ("call",))
        for axes in ((0, 0), (1, -1)):
            rows += [
                Row(
                    r.id,
                    r.program,
                    r.params,
                    expect=WRONG13,
                    why="1.3.1 kept the axes that the list named, once each, in their own order: "
                    "a repeated axis was transformed once. ducc0 refuses a repeated axis, "
                    "NumPy's fftn transforms it twice",
                    match=r"name an axis twice.*JAXbind 1\.3",
                )
                for r in _fft(f"axes={axes!r}", op, dict(axes=axes), ("call", "transpose"))
            ]
        rows += [
            Row(
                r.id,
                r.program,
                r.params,
                expect=DIFFERS13,
                why="1.3.1 kept the axes among 0..ndim-1 that the list named, so a negative "
                "axis beside a non-negative one was silently not transformed",
            )
            for r in _fft("axes=(0, -1)", op, dict(axes=(0, -1)), ("call", "transpose"))
        ]
        rows += _fft(
            "float32",
            op,
            {},
            ("call", "vmap"),
            x=(C.astype(np.complex64) if op == "c2c" else R.astype(np.float32)),
        )
        rows += _fft(
            "3-D",
            op,
            dict(axes=(0, 2)),
            ("call", "vmap", "transpose"),
            x=(_complex(3, 4, 5) if op == "c2c" else _real(3, 4, 5)),
        )
        rows += _fft("wrong dtype", op, {}, ("call",), x=(R if op == "c2c" else C))
        rows += _fft(
            "empty",
            op,
            {},
            ("call", "transpose"),
            x=np.zeros((0, 4), complex if op == "c2c" else float),
        )
    for forward in BOOLS:
        rows += _fft(f"forward={forward!r}", "c2c", dict(forward=forward), ("call", "transpose"))
    for in_axis in (0, 1, 2):
        rows += _fft(f"vmap in_axes={in_axis}", "c2c", dict(axes=(1,)), ("vmap",), in_axis=in_axis)
    return rows


# --- jaxducc0: get_healpix_sht, nalm ------------------------------------------------------


def nalm(lmax, mmax):
    return ((mmax + 1) * (mmax + 2)) // 2 + (mmax + 1) * (lmax - mmax)


SHT_TRANSFORMS = ("call", "jit", "transpose", "vmap", "grad")


def sht_row(id, args=(), kwargs=None, transforms=SHT_TRANSFORMS, dtype=np.float64):
    """Rows of get_healpix_sht(*args, **kwargs) applied to a real alm array of the right
    shape (worked out from the parameters' integer values)."""
    kwargs = kwargs or {}
    names = ("nside", "lmax", "mmax", "spin", "nthreads")
    given = dict(zip(names, args), **kwargs)
    nside, lmax, mmax, spin = (int(given[k]) for k in names[:4])
    ncomp = 1 if spin == 0 else 2
    x = _real(ncomp, max(2 * nalm(lmax, mmax) - lmax - 1, 1)).astype(dtype)
    ct = _real(ncomp, 12 * nside**2).astype(dtype)
    return [
        Row(
            f"get_healpix_sht {id}:{t}",
            "sht",
            dict(factory_args=tuple(args), factory=kwargs, x=x, transform=t, cotangent=ct),
        )
        for t in transforms
    ]


def _sht_rows():
    rows = sht_row("plain", (4, 8, 8, 0))
    rows += sht_row("keywords", kwargs=dict(nside=4, lmax=8, mmax=6, spin=2, nthreads=1))
    rows += sht_row("float32", (2, 4, 4, 0), dtype=np.float32)
    for spin in (1, 2, 3):
        rows += sht_row(
            f"nside 4, lmax 8, mmax 5, spin={spin}",
            (4, 8, 5, spin),
            transforms=("call", "transpose"),
        )
    for name, index, values in (
        ("nside", 0, ints(2)),
        ("lmax", 1, ints(6)),
        ("mmax", 2, ints(6) + ints(0)),
        ("spin", 3, ints(0) + ints(1) + ints(2)),
        ("nthreads", 4, ints(1) + ints(2) + [0]),
    ):
        for value in values:
            args = [2, 6, 6, 0, 1]
            args[index] = value
            rows += sht_row(f"{name}={value!r}", tuple(args), transforms=("call",))
    for what, args in (
        ("mmax > lmax", (2, 4, 5, 0)),
        ("lmax < spin", (2, 1, 1, 2)),
        ("spin < 0", (2, 4, 4, -2)),
        ("nside 0", (0, 4, 4, 0)),
        ("nthreads < 0", (2, 4, 4, 0, -1)),
    ):
        rows += sht_row(what, args, transforms=("call",))
    # keyword arguments at call time replace the factory's (both return a partial)
    for what, kwargs in (
        ("nthreads=2", dict(nthreads=2)),
        ("nthreads=np.int64(2)", dict(nthreads=np.int64(2))),
        ("an unknown one", dict(extra=1)),
    ):
        rows += [
            Row(r.id, r.program, {**r.params, "kwargs": kwargs})
            for r in sht_row(f"called with {what}", (2, 4, 4, 0), transforms=("call", "transpose"))
        ]
    for args in ((5, 3), (np.int64(5), np.int32(3)), (5.0, 3), (True, 0), (0, 0), (10, 10)):
        rows.append(Row(f"nalm{args!r}", "nalm", dict(args=args)))
    return rows


# --- jaxducc0: get_wgridder ------------------------------------------------------------------

UVW = _rng.uniform(-300, 300, (40, 3))
FREQ = np.array([1.0e9, 1.1e9])
IMAGE = _real(32, 32)
VIS = _complex(40, 2)
WGRIDDER = dict(
    pixsize_x=2e-5, pixsize_y=2e-5, npix_x=32, npix_y=32, epsilon=1e-6, do_wgridding=True
)
WGRIDDER_TRANSFORMS = ("call", "jit", "transpose", "vmap", "grad")


def wgridder_row(id, transforms=WGRIDDER_TRANSFORMS, image=IMAGE, uvw=UVW, freq=FREQ, **factory):
    epsilon = float(factory.get("epsilon", WGRIDDER["epsilon"]))
    return [
        Row(
            f"get_wgridder {id}:{t}",
            "wgridder",
            dict(
                factory={**WGRIDDER, **factory},
                uvw=uvw,
                freq=freq,
                image=image,
                transform=t,
                cotangent=np.zeros((len(uvw), len(freq)), complex) + VIS[: len(uvw), :1],
            ),
            rtol=max(10 * epsilon, 1e-12),
        )
        for t in transforms
    ]


def _wgridder_rows():
    rows = wgridder_row("plain")
    both = ("call", "transpose")
    spellings = {
        "verbosity": ints(0),
        "nthreads": ints(1) + ints(2) + [0],
        "npix_x": ints(32),
        "npix_y": ints(32),
        "flip_v": BOOLS,
        "do_wgridding": BOOLS,
        "pixsize_x": floats(2e-5),
        "pixsize_y": floats(2e-5),
        "epsilon": floats(1e-6) + [1e-3, 1],
        "flip_u": BOOLS,
        # (DUCC's other flags go the same way as flip_u; a few spellings each)
        "flip_w": [True, np.False_, None],
        "divide_by_n": [False, np.True_, 0],
        "allow_nshift": [False, np.True_, None],
        "center_x": floats(1e-4) + [0],
        "center_y": floats(-1e-4),
        "sigma_min": floats(1.2),
        "sigma_max": floats(2.0),
        "double_precision_accumulation": BOOLS,
    }
    for name, values in spellings.items():
        # the adjoint's own option, and the ones that change its accuracy: both directions
        adjoint = name in ("double_precision_accumulation", "sigma_min", "sigma_max", "epsilon")
        for value in values:
            rows += wgridder_row(
                f"{name}={value!r}", both if adjoint else ("call",), **{name: value}
            )
    rows += wgridder_row("sigma_min and sigma_max", both, sigma_min=1.5, sigma_max=2.5)
    rows += wgridder_row("sigma_min > sigma_max", both, sigma_min=2.5, sigma_max=1.5)
    rows += wgridder_row("verbosity=1", ("call",), verbosity=1)
    for name, value in (
        ("npix_x", 33),
        ("npix_x", 16),
        ("epsilon", 0),
        ("epsilon", 1e-14),
        ("nthreads", -1),
        ("nthreads", 2.5),
        ("verbosity", 0.5),
        ("pixsize_x", -1e-5),
        ("wgt", np.ones((40, 2))),
        ("mask", np.ones((40, 2), np.uint8)),
        ("bogus", 1),
    ):
        image = np.zeros((value, 32)) if name == "npix_x" else IMAGE
        rows += wgridder_row(f"{name}={value!r}", ("call",), image=image, **{name: value})
    # npix_x that does not describe the image: 1.3.1's forward used the image's shape
    for value, match in (
        (32.5, "npix_x must be an integer"),
        (0, "npix_x must be >= 2"),
        (64, r"image must be \(64, 32\).*the transpose"),
    ):
        rows += [
            Row(
                r.id,
                r.program,
                r.params,
                expect=WRONG13,
                why="1.3.1's forward never read npix_x and used the image's own shape; the "
                "op's transpose made (or tried to make) an image of npix_x rows, so every "
                "gradient and transpose failed (JAX: Expected cotangent type float64[32,32])",
                match=match,
            )
            for r in wgridder_row(
                f"npix_x={value!r}, image 32 x 32", ("call", "jit", "vmap"), npix_x=value
            )
        ]
    # the data real code passes
    rows += wgridder_row("float32 image", image=IMAGE.astype(np.float32), epsilon=1e-4)
    rows += wgridder_row("float32 image, epsilon 1e-6", image=IMAGE.astype(np.float32))
    rows += wgridder_row("float32 uvw", both, uvw=UVW.astype(np.float32))
    rows += wgridder_row("one channel", both, freq=FREQ[:1])
    rows += wgridder_row("rectangular image", both, image=_real(32, 48), npix_y=48)
    rows += wgridder_row("w-gridding off", both, do_wgridding=False)
    rows += wgridder_row("uvw as a list", ("call",), uvw=UVW.tolist())
    for kwargs in (
        dict(nthreads=np.int64(2)),
        dict(verbosity=False),
        dict(flip_v=True),
        dict(epsilon=1e-4),
        dict(divide_by_n=False),
        dict(unknown=1),
    ):
        rows += [
            Row(r.id, r.program, {**r.params, "kwargs": kwargs}, rtol=r.rtol)
            for r in wgridder_row(f"called with {kwargs!r}", both)
        ]
    rows += wgridder_row("channels in decreasing order", both, freq=FREQ[::-1].copy())
    rows += wgridder_row("channels unsorted", both, freq=np.array([1.1e9, 1.0e9, 1.2e9]))
    rows += wgridder_row(
        "a NaN coordinate", both, uvw=np.where(np.arange(40)[:, None] == 3, np.nan, UVW)
    )
    rows += wgridder_row("an infinite frequency", both, freq=np.array([1e9, np.inf]))
    rows += wgridder_row("a negative frequency", ("call",), freq=np.array([1e9, -1e9]))
    rows += wgridder_row("no rows", both, uvw=np.zeros((0, 3)))
    rows += wgridder_row("no channels", both, freq=np.zeros(0))
    return rows


TABLE: list[Row] = (
    _fixed_rows()
    + _batching_rows()
    + _calling_convention_rows()
    + _kwargs_rows()
    + _fft_rows()
    + _sht_rows()
    + _wgridder_rows()
)
_dups = [k for k, n in __import__("collections").Counter(r.id for r in TABLE).items() if n > 1]
assert not _dups, f"row ids must be unique: {_dups[:5]}"
