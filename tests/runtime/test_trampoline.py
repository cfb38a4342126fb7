"""The FFI handler itself: unknown names, format versions, kwargs decoding, and the check
of every buffer against the binding's abstract function."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import ops

import jaxbind
from jaxbind import _callformat, _definition, _ext, _kwargs
from jaxbind._rules.lowering import CPU_TARGET


def _raw_call(x, out=None, **attrs):
    out = out if out is not None else jax.ShapeDtypeStruct(x.shape, x.dtype)
    call = jax.ffi.ffi_call(CPU_TARGET, out)
    return jax.block_until_ready(call(x, **attrs))


def _attrs(
    binding="tests.nope",
    role="f",
    fmt=3,
    blob=None,
    digest=None,
    levels=0,
    flags=b"\0",
    n_fixed=0,
    trees=b"",
    definition=None,
):
    """Call attributes as a program of call format `fmt` carries them (valid digest; for
    format 4, the record of the binding's definition as it is now, unless `definition`)."""
    blob = blob if blob is not None else _kwargs.encode_kwargs({}).blob
    if definition is None:
        found = jaxbind._binding.lookup(binding) if fmt >= 4 else None
        definition = "{}" if found is None else _definition.record(found.options, False)
    attrs = dict(
        jaxbind_format=np.int32(fmt),
        binding=binding,
        role=role,
        kwargs=np.frombuffer(blob, np.uint8),
    )
    if fmt == 1:
        auto = _callformat.CallAttributes(binding, role, blob, format=1).digest
    else:
        auto = _callformat.CallAttributes(
            binding, role, blob, levels, flags, n_fixed, trees, definition, format=fmt
        ).digest
        attrs.update(
            loop_levels=np.int32(levels),
            loop_batched=np.frombuffer(flags, np.uint8),
            n_fixed=np.int32(n_fixed),
        )
    if fmt >= 3:
        attrs["trees"] = np.frombuffer(trees, np.uint8)
    if fmt >= 4:
        attrs["definition"] = definition
    attrs["site"] = np.int64(digest if digest is not None else auto)
    return attrs


@pytest.mark.parametrize("fmt", [1, 2, 3, 4])
def test_unknown_binding_is_a_clean_error(fmt):
    with pytest.raises(Exception, match="no binding named 'tests.nope' is registered"):
        _raw_call(jnp.ones(3), **_attrs(fmt=fmt))
    with pytest.raises(Exception, match="no binding named 'tests.nope' is registered"):
        _raw_call(jnp.ones(3), **_attrs(fmt=fmt))  # still clean the second time


def test_newer_call_format_names_both_versions():
    with pytest.raises(
        Exception, match="call format 99, but this jaxbind reads formats 1 to 4; upgrade jaxbind"
    ):
        _raw_call(jnp.ones(3), **_attrs(fmt=99))


def test_missing_attributes():
    with pytest.raises(Exception, match="no 'jaxbind_format' attribute"):
        _raw_call(jnp.ones(3))
    with pytest.raises(Exception, match="lacks one of the attributes"):
        _raw_call(jnp.ones(3), jaxbind_format=np.int32(1))
    attrs = _attrs("tests.double")
    del attrs["n_fixed"]
    with pytest.raises(
        Exception,
        match="'tests.double'.*lacks one of the attributes "
        "'loop_levels', 'loop_batched', 'n_fixed'",
    ):
        _raw_call(jnp.ones(3), **attrs)
    attrs = _attrs("tests.double")
    del attrs["trees"]
    with pytest.raises(Exception, match="'tests.double'.*lacks the attribute 'trees'"):
        _raw_call(jnp.ones(3), **attrs)
    # a pytree structure for an op of the 1.3 API, which takes none: a clean error
    with pytest.raises(Exception, match="takes no pytree structure"):
        _raw_call(jnp.ones(3), **_attrs("tests.double", trees=_kwargs.encode_kwargs({}).blob))


double = ops.doubling("tests.double")


@pytest.mark.parametrize("fmt", [1, 2, 3])
def test_tampered_digest_is_rejected(fmt):
    attrs = _attrs("tests.double", fmt=fmt, digest=12345)
    with pytest.raises(Exception, match="digest mismatch"):
        _raw_call(jnp.ones(3), **attrs)


@pytest.mark.parametrize("role", ["T7", "T01", "T\u0661", "x", ""])
def test_unknown_role_is_a_clean_error(role):
    with pytest.raises(Exception, match=f"has no role '{role}'"):
        _raw_call(jnp.ones(3), **_attrs("tests.double", role=role))


@pytest.mark.parametrize("fmt", [1, 2, 3, 4])
def test_hand_made_calls_of_both_formats_run(fmt):
    np.testing.assert_allclose(
        _raw_call(jnp.arange(3.0), **_attrs("tests.double", fmt=fmt)), [0, 2, 4]
    )


def test_a_call_whose_recorded_definition_differs_is_refused():
    """Format 4 records the op's definition; one that the op no longer has (here a side
    effect it never had) stops the call before its body runs."""
    binding = jaxbind._binding.lookup("tests.double")
    recorded = json.loads(_definition.record(binding.options, False))
    recorded["effect"] = "ordered"
    text = json.dumps(recorded, sort_keys=True)
    with pytest.raises(Exception, match="traced with ordered=True, but the op now has no side"):
        _raw_call(jnp.arange(3.0), **_attrs("tests.double", fmt=4, definition=text))
    with pytest.raises(Exception, match="lacks the attribute 'definition'"):
        fresh = _kwargs.encode_kwargs({"never_seen": 1}).blob  # a site not yet cached
        attrs = _attrs("tests.double", fmt=4, blob=fresh)
        del attrs["definition"]
        _raw_call(jnp.arange(3.0), **attrs)


def test_a_format_4_call_with_an_empty_definition_record_is_refused():
    """An empty record is no record: format 4 requires one, and a call without it never
    reaches the body, whatever the op now declares (here, aliases the program lacks)."""
    inplace = ops.doubling("tests.double_inplace", input_output_aliases={0: 0})
    assert inplace is not None
    for name in ("tests.double", "tests.double_inplace"):
        with pytest.raises(Exception, match=f"'{name}'.*empty 'definition' attribute.*format 4"):
            _raw_call(jnp.arange(3.0), **_attrs(name, fmt=4, definition=""))


def test_outputs_that_differ_from_the_abstract_function_are_refused():
    """A program may not hand the callable buffers its abstract function does not declare."""
    x = jnp.arange(3.0)
    for out, what in (
        (jax.ShapeDtypeStruct((5,), x.dtype), r"output 0 is float32\[5\]"),
        (jax.ShapeDtypeStruct((3,), jnp.int32), r"output 0 is int32\[3\]"),
        ((jax.ShapeDtypeStruct((3,), x.dtype),) * 2, "gives it 2 outputs"),
    ):
        with pytest.raises(Exception, match=f"'tests.double'.*{what}.*declares"):
            _raw_call(x, out=out, **_attrs("tests.double"))
    np.testing.assert_allclose(_raw_call(x, **_attrs("tests.double")), [0, 2, 4])  # still fine


def test_abstract_function_failing_on_the_buffers_is_a_clean_error():
    def abstract(x, **kwargs):
        if x.shape[0] > 4:
            raise ValueError("at most 4 elements")
        return ((x.shape, x.dtype),)

    op = jaxbind.get_linear_call(ops.double, None, abstract, None, name="tests.at_most_4")  # noqa
    with pytest.raises(
        Exception, match="'tests.at_most_4'.*abstract function fails.*at most 4 elements"
    ):
        _raw_call(jnp.ones(6), **_attrs("tests.at_most_4"))


def test_each_new_buffer_signature_is_checked_once_per_site():
    calls = []

    def abstract(x, **kwargs):
        calls.append(x.shape)
        return ((x.shape, x.dtype),)

    op = jaxbind.get_linear_call(ops.double, None, abstract, None, name="tests.checks_once")  # noqa
    for n in (3, 3, 4, 3, 4, 4):  # one site, two signatures
        _raw_call(jnp.ones(n), **_attrs("tests.checks_once"))
    assert calls == [(3,), (4,)]


def test_kwargs_are_decoded_once_per_call_site():
    dumps = []

    def f(out, args, kwargs_dump):
        dumps.append(kwargs_dump)
        kw = jaxbind.load_kwargs(kwargs_dump)
        kw.pop("k")  # callables may pop: each call gets a fresh dict
        out[0][...] = args[0]

    op = jaxbind.get_linear_call(f, None, ops.same_as_first, None, name="tests.records_dumps")
    fn = jax.jit(lambda x: op(x, k=np.arange(3), s="text")[0])
    for _ in range(5):
        fn(jnp.ones(2))
    assert len(dumps) == 5 and all(d is dumps[0] for d in dumps)
    kw = jaxbind.load_kwargs(dumps[0])
    assert kw["s"] == "text" and not kw["k"].flags.writeable
    np.testing.assert_array_equal(kw["k"], np.arange(3))


def test_equal_kwargs_hit_the_jit_cache():
    traces = []

    def abstract(x, **kwargs):
        traces.append(kwargs)
        return ((x.shape, x.dtype),)

    op = jaxbind.get_linear_call(ops.double, None, abstract, None, name="tests.counts_traces")
    fn = jax.jit(lambda x, scale: op(x, scale=scale, order=(1, 2))[0], static_argnums=1)
    x = jnp.ones(3)
    fn(x, 2)
    seen = len(traces)  # the trace, and the run-time check of the first call's buffers
    for _ in range(3):
        fn(x, 2)
    assert len(traces) == seen and fn._cache_size() == 1
    fn(x, 3)
    assert len(traces) > seen and fn._cache_size() == 2


def test_load_kwargs_accepts_jaxbind13_dumps():
    import pickle

    blob = np.frombuffer(pickle.dumps({"a": 1}), np.uint8)
    assert jaxbind.load_kwargs(blob) == {"a": 1}
    with pytest.raises(TypeError, match="expects the kwargs_dump argument"):
        jaxbind.load_kwargs(3)


def test_extension_reports_its_build():
    assert _ext.call_format == _callformat.FORMAT == 4
    assert isinstance(_ext.jaxlib_version, str) and _ext.jaxlib_version[0].isdigit()
    assert len(_ext.ffi_api_version) == 2


def test_python_and_the_trampoline_allow_the_same_batch_levels():
    """_callformat.MAX_LEVELS is the trampoline's own limit (C++'s Loop::kMaxLevels, which
    the extension does not export): a site of that many levels is made, and one more is
    refused by the attributes' reader and by the trampoline alike."""
    from jaxbind._runtime.sites import SiteDescription

    def site(levels):
        description = SiteDescription(
            "tests.levels", "'tests.levels' (f)", None, None, levels, (True,), "device",
            lambda ins, outs: None, None, None,
        )  # fmt: skip
        return _ext.Site(description)

    most = _callformat.MAX_LEVELS
    site(most)
    with pytest.raises(ValueError, match="batch levels are out of range"):
        site(most + 1)
    with pytest.raises(Exception, match=rf"batch levels \({most + 1}\) are out of range"):
        _raw_call(jnp.ones(3), **_attrs(fmt=4, levels=most + 1, flags=b"\1"))


# The trampoline reuses a site's array views from one call to the next (only the
# data pointer changes). These check that reuse never hands a callable a stale view.


def _seen_shapes_op(name):
    seen = []

    def f(out, args, kwargs_dump):
        seen.append((args[0].shape, out[0].shape, args[0].flags.writeable, out[0].flags.writeable))
        out[0][...] = 2 * args[0]

    op = jaxbind.get_linear_call(f, f, ops.same_as_first, ops.same_as_first, name=name)
    return op, seen


def test_reused_views_follow_new_shapes_of_the_same_site():
    op, seen = _seen_shapes_op("tests.reuse_shapes")
    fn = jax.jit(lambda x: op(x)[0])
    for n in (3, 5, 3, 0, 5):  # one site (same binding, role, kwargs), changing shapes
        x = jnp.arange(n, dtype=jnp.float32)
        np.testing.assert_array_equal(fn(x), 2 * np.arange(n))
    assert [s[0] for s in seen] == [(3,), (5,), (3,), (5,)]  # XLA skips the empty call
    assert all(s[2:] == (False, True) for s in seen)  # inputs read-only, outputs writable


@pytest.mark.filterwarnings("ignore:Setting the shape:DeprecationWarning")
def test_view_reshaped_by_the_callable_is_not_reused():
    def f(out, args, kwargs_dump):
        x = args[0]
        assert x.shape == (2, 3), x.shape
        x.shape = (6,)  # legal on a view: changes this array object only
        out[0].shape = (6,)
        out[0][...] = x + 1

    op = jaxbind.get_nonlinear_call(
        f, (None, None), ops.same_as_first, None, name="tests.reshaping_callable"
    )
    fn = jax.jit(lambda x: op(x)[0])
    x = jnp.arange(6.0).reshape(2, 3)
    for _ in range(3):
        np.testing.assert_array_equal(fn(x), np.arange(6.0).reshape(2, 3) + 1)


def test_results_do_not_alias_across_calls_with_reused_views():
    op, _ = _seen_shapes_op("tests.reuse_alias")
    fn = jax.jit(lambda x: op(x)[0])
    ys = [fn(jnp.full(4, float(k))) for k in range(5)]  # all results alive at once
    for k, y in enumerate(ys):
        np.testing.assert_array_equal(y, np.full(4, 2.0 * k))


def test_a_pytree_structure_in_an_older_format_is_refused():
    """Format 2 has no `trees` attribute (its digest does not cover one): a program that
    carries it anyway was not written by jaxbind, and is refused rather than ignored when
    its site is instantiated (a site of its own: keyword arguments no other test uses)."""
    attrs = _attrs("tests.double", fmt=2, blob=_kwargs.encode_kwargs({"older": 1}).blob)
    attrs["trees"] = np.frombuffer(_kwargs.encode_kwargs({}).blob, np.uint8)
    with pytest.raises(Exception, match="call format 2 has no pytree structure attribute"):
        _raw_call(jnp.ones(3), **attrs)
