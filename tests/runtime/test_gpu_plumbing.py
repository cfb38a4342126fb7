"""The GPU path, as far as a machine without a GPU can check it: lowering for
CUDA, the CudaArray interfaces, and the dispatcher's batching over device
pointers (exercised on host memory). The GPU itself is tested in tests/gpu/."""

import contextlib
import ctypes
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import ops

import jaxbind
from jaxbind import _ext
from jaxbind._runtime import gpu as _gpu
from jaxbind._runtime.sites import SiteDescription

double = ops.doubling("gpu_plumbing.double")


@pytest.fixture(autouse=True)
def _no_gpu_frameworks(monkeypatch):
    """These calls run on host memory with made-up streams and devices: where a GPU
    machine has imported the real CuPy or PyTorch, the plans must not hand them those."""
    for name in ("cupy", "torch"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def _cuda_text(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_lowering_for_cuda_targets_the_cuda_handler():
    x = jnp.ones((4, 3), jnp.float32)
    text = _cuda_text(lambda x: double(x, scale=2)[0], x)
    assert "jaxbind_cuda" in text and "jaxbind_cpu" not in text
    assert 'binding = "gpu_plumbing.double"' in text
    grad = _cuda_text(jax.grad(lambda x: jnp.sum(double(x)[0])), x)
    assert 'role = "T"' in grad
    vm = _cuda_text(jax.vmap(lambda v: double(v)[0]), x)
    assert 'num_batch_dims = "1"' in vm


def test_platform_mode_is_checked_and_part_of_the_binding():
    with pytest.raises(ValueError, match="platform_mode must be one of"):
        jaxbind.get_linear_call(
            ops.double, ops.double, ops.same_as_first, None, platform_mode="gpu"
        )
    host = ops.doubling("gpu_plumbing.host_double", platform_mode="host")
    assert host.binding.options.platform_mode == "host"
    # On the CPU, host mode behaves as the default
    np.testing.assert_array_equal(jax.jit(lambda x: host(x)[0])(jnp.arange(3.0)), [0, 2, 4])
    with pytest.raises(ValueError, match="already used"):
        ops.doubling("gpu_plumbing.host_double", platform_mode="device")


def test_current_call_on_cpu():
    seen = []

    def f(out, args, kwargs_dump):
        seen.append(jaxbind.current_call())
        out[0][...] = args[0]

    op = jaxbind.get_nonlinear_call(
        f, (None, None), ops.same_as_first, None, name="gpu_plumbing.where"
    )
    x = jax.device_put(jnp.ones(2), jax.devices("cpu")[0])  # also where a GPU is the default
    jax.block_until_ready(jax.jit(lambda x: op(x)[0])(x))
    assert seen == [jaxbind.CallContext("cpu")]
    assert jaxbind.current_call().platform == "cpu"  # outside any call


def test_cuda_array_interface_and_dlpack_metadata():
    a = jaxbind.CudaArray(0x7000, (2, 3), np.float32, True, 1234, 1)
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (2, 3) and cai["typestr"] == "<f4" and cai["version"] == 3
    assert cai["data"] == (0x7000, True) and cai["stream"] == 1234 and cai["strides"] is None
    assert a.__dlpack_device__() == (2, 1)
    assert (a.ndim, a.size, a.nbytes) == (2, 6, 24)
    assert (
        jaxbind.CudaArray(0, (1,), np.float32, False, 0, 0).__cuda_array_interface__["stream"] == 1
    )  # the legacy default stream is 1, never 0
    assert _gpu._dlpack_dtype(np.dtype(np.complex64)) == (5, 64)


def test_cuda_array_used_as_numpy_says_to_use_host_mode():
    """A NumPy callable in device mode gets a clear error, not an object array."""
    a = jaxbind.CudaArray(0x7000, (3,), np.float64, False, 1, 0)
    for use in (
        np.asarray,
        lambda a: np.cumsum(a),
        lambda a: a[0],
        lambda a: a.__setitem__(Ellipsis, 1.0),
        list,
    ):
        with pytest.raises(TypeError, match="CUDA device buffer.*platform_mode='host'"):
            use(a)
    assert bool(a) and a.ndim == 1  # still an ordinary object otherwise
    assert _gpu._dlpack_dtype(np.dtype(jnp.bfloat16)) == (4, 16)
    assert _gpu._dlpack_dtype(np.dtype(np.bool_)) == (6, 8)
    with pytest.raises(TypeError, match="DLPack has no type for float8_e4m3fn"):
        _gpu._dlpack_dtype(np.dtype(jnp.float8_e4m3fn))
    with pytest.raises(BufferError, match="cannot copy"):
        a.__dlpack__(copy=True)


def _site(callable_, levels=0, batched=(), mode="device"):
    """A call site of `callable_` as instantiate makes one (no buffer check: the GPU
    handler's body runs after it)."""
    description = SiteDescription(
        "tests.gpu", "'tests.gpu' (f)", callable_, None, levels, batched, mode, None, None
    )
    return _ext.Site(description)


def test_gpu_batch_loop_walks_elements_by_pointer_in_cpp():
    """The CUDA handler's body: the trampoline's one batch loop (in C++) hands the
    dispatcher each element's pointers. Host memory stands in for device memory: nothing
    on the way dereferences a device pointer."""
    x = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    fixed = np.array([10.0, 20.0], np.float32)
    y = np.zeros((3, 4), np.float32)
    calls = []

    def callable_(out, args, kwargs_dump):
        ctx = jaxbind.current_call()
        calls.append((ctx, [a.shape for a in args], out[0].shape))
        src = np.ctypeslib.as_array(
            ctypes.cast(args[1].ptr, ctypes.POINTER(ctypes.c_float)), args[1].shape
        )
        dst = np.ctypeslib.as_array(
            ctypes.cast(out[0].ptr, ctypes.POINTER(ctypes.c_float)), out[0].shape
        )
        dst[...] = src * 2 + float(args[0].ptr == fixed.ctypes.data)

    f32 = 11  # XLA element type of float32
    ins = ((fixed.ctypes.data, (2,), f32), (x.ctypes.data, (3, 4), f32))
    outs = ((y.ctypes.data, (3, 4), f32),)
    _ext.gpu_call_for_tests(_site(callable_, 1, (False, True)), 99, 0, ins, outs)
    np.testing.assert_array_equal(y, 2 * x + 1)  # 3 elements, the fixed input unbatched
    assert len(calls) == 3
    assert all(c[0] == jaxbind.CallContext("cuda", 99, 0, "device") for c in calls)
    assert calls[0][1] == [(2,), (4,)] and calls[0][2] == (4,)
    assert jaxbind.current_call().platform == "cpu"  # reset afterwards


def test_gpu_batch_loop_checks_the_buffers_first():
    """The same bounds check as on the CPU: an input that does not lead with the batch
    axes never reaches the dispatcher."""
    x, y = np.zeros((2, 4), np.float32), np.zeros((3, 4), np.float32)
    calls = []
    site = _site(lambda *a: calls.append(a), 1, (True,))
    ins, outs = ((x.ctypes.data, (2, 4), 11),), ((y.ctypes.data, (3, 4), 11),)
    with pytest.raises(ValueError, match="input 0 does not lead with the batch axes of output 0"):
        _ext.gpu_call_for_tests(site, 0, 0, ins, outs)
    assert calls == []


def test_dispatch_rejects_unknown_element_types():
    with pytest.raises(TypeError, match="element type 99"):
        _ext.gpu_call_for_tests(_site(lambda *a: None), 0, 0, ((0, (1,), 99),), ())


class _HostMemoryDriver:
    """Host memory standing in for device memory: copies are memmoves, streams no-ops."""

    def to_host(self, dst, src, stream):
        ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def to_device(self, dst, src, stream):
        ctypes.memmove(dst, src.ctypes.data, src.nbytes)

    def synchronize(self, stream):
        pass


def test_host_mode_runs_the_same_batch_loop_on_host_copies(monkeypatch):
    """Host mode: per batch element (the C++ loop), copies in, the callable on read-only
    NumPy copies (the fixed input unbatched), copies out; an aliased output starts as its
    input."""
    monkeypatch.setattr(_gpu, "_driver", _HostMemoryDriver)
    x = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    fixed = np.array([10.0, 20.0], np.float32)
    y = np.zeros((3, 4), np.float32)
    empty = np.zeros((3, 0), np.float32)
    seen = []

    def callable_(out, args, kwargs_dump):
        seen.append((args[0].flags.writeable, args[1].flags.writeable, out[0].flags.writeable))
        out[0][...] = 2 * args[1] + args[0][0]
        assert out[1].shape == (0,)

    f32 = 11
    ins = ((fixed.ctypes.data, (2,), f32), (x.ctypes.data, (3, 4), f32))
    outs = ((y.ctypes.data, (3, 4), f32), (empty.ctypes.data, (3, 0), f32))
    site = _site(callable_, 1, (False, True), mode="host")
    _ext.gpu_call_for_tests(site, 0, 0, ins, outs)
    np.testing.assert_array_equal(y, 2 * x + 10)
    assert seen == [(False, False, True)] * 3

    z = np.full(4, 7.0, np.float32)  # input 0 and output 0 share memory (aliases)

    def add_one(out, args, kwargs_dump):
        out[0][...] += 1

    aliased = ((z.ctypes.data, (4,), f32),)
    _ext.gpu_call_for_tests(_site(add_one, mode="host"), 0, 0, aliased, aliased)
    np.testing.assert_array_equal(z, 8.0)


def _stateful(name, made, key=()):
    """A 1.3-API op whose callable doubles its input plus its state's offset, and the
    attributes XLA's instantiate stage would hand Python for its f."""
    from jaxbind import _definition
    from jaxbind._callformat import NO_LOOP, CallAttributes
    from jaxbind._kwargs import encode_kwargs

    @jaxbind.state(key=key)
    def offset(*, shift, x=None):
        made.append((jaxbind.current_call(), None if x is None else np.array(x)))
        return float(shift) + (0.0 if x is None else float(np.sum(x)))

    def f(out, args, kwargs_dump):
        out[0][...] = 2 * args[0] + jaxbind.load_state(kwargs_dump)

    op = jaxbind.get_nonlinear_call(
        f,
        (None, None),
        lambda x, **kw: ((x.shape, x.dtype),),
        state=offset,
        name=name,
        replace=True,
        platform_mode="host",
    )
    record = _definition.record(op.binding.options, False)
    blob = encode_kwargs({"shift": 1.0}).blob
    call = CallAttributes.of_call(name, "f", blob, NO_LOOP, 1, 0, definition=record)
    return op, {
        k: (v.tobytes() if isinstance(v, np.ndarray) else v)
        for k, v in call.ffi_attributes().items()
    }


def _as_found(attrs):
    found = dict(attrs)
    found["jaxbind_format"], found["site"] = int(found["jaxbind_format"]), int(found["site"])
    found["loop_levels"], found["n_fixed"] = int(found["loop_levels"]), int(found["n_fixed"])
    return found


def test_a_gpu_state_is_set_up_per_device_at_its_first_call_not_at_instantiate(monkeypatch):
    """XLA gives no stream when it instantiates a site: on a GPU the state is set up at
    the first call on each device, inside the call (jaxbind.current_call() gives the
    device and stream), once per device; on the CPU, at instantiate."""
    from jaxbind._runtime.sites import instantiate_site

    monkeypatch.setattr(_gpu, "_driver", _HostMemoryDriver)
    made = []
    _op, attrs = _stateful("gpu_plumbing.stateful", made)
    site, _ = instantiate_site(dict(_as_found(attrs), platform="cuda"))
    assert made == []  # nothing at instantiate on a GPU
    x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    ins, outs = ((x.ctypes.data, (4,), 11),), ((y.ctypes.data, (4,), 11),)
    for device in (0, 1, 0, 1):
        _ext.gpu_call_for_tests(site, 7, device, ins, outs)
        np.testing.assert_array_equal(y, 2 * x + 1)
    assert [(c.platform, c.stream, c.device) for c, _ in made] == [("cuda", 7, 0), ("cuda", 7, 1)]
    cpu_site, _ = instantiate_site(dict(_as_found(attrs), platform="cpu"))
    assert len(made) == 3 and made[2][0].platform == "cpu"  # at instantiate, on the CPU
    del site, cpu_site


def test_a_gpu_state_keyed_on_an_input_copies_it_to_the_host_and_keeps_it(monkeypatch):
    from jaxbind._runtime.sites import instantiate_site

    monkeypatch.setattr(_gpu, "_driver", _HostMemoryDriver)
    made = []
    _op, attrs = _stateful("gpu_plumbing.keyed", made, key=("x",))
    site, _ = instantiate_site(dict(_as_found(attrs), platform="cuda"))
    x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    ins, outs = ((x.ctypes.data, (4,), 11),), ((y.ctypes.data, (4,), 11),)
    for _ in range(3):
        _ext.gpu_call_for_tests(site, 7, 0, ins, outs)
        np.testing.assert_array_equal(y, 2 * x + 1 + 6)
    assert len(made) == 1 and np.array_equal(made[0][1], x)
    x[0] = 10  # the device buffer changes: set up again, from the new values
    _ext.gpu_call_for_tests(site, 7, 0, ins, outs)
    np.testing.assert_array_equal(y, 2 * x + 1 + 16)
    assert len(made) == 2
    del site


# --- GPU plans: made once per site, stream, device and signature -------------------

F32 = 11  # XLA element type of float32


@pytest.fixture
def plans_made():
    """The GPU plans the trampoline asks for, in order (each as made by _gpu.plan)."""
    made = []

    def counting(*args):
        made.append(_gpu.plan(*args))
        return made[-1]

    _ext.set_gpu_plan(counting)
    yield made
    _ext.set_gpu_plan(_gpu.plan)


def _buffers(*arrays):
    return tuple((a.ctypes.data, a.shape, F32) for a in arrays)


def test_a_plan_is_made_once_and_its_views_repointed_at_each_call(plans_made):
    seen = []  # (ids and addresses only: a callable that keeps a view gets new ones)
    site = _site(
        lambda out, args, kw: seen.append((id(out[0]), id(args[0]), out[0].ptr, args[0].ptr))
    )
    calls = [(np.zeros(4, np.float32), np.zeros(4, np.float32)) for _ in range(3)]
    for x, y in calls:
        _ext.gpu_call_for_tests(site, 5, 0, _buffers(x), _buffers(y))
    (plan,) = plans_made
    assert all(s[:2] == (id(plan.views[1]), id(plan.views[0])) for s in seen)
    assert [s[2:] for s in seen] == [(y.ctypes.data, x.ctypes.data) for x, y in calls]
    assert jaxbind.current_call().platform == "cpu"


def test_batch_elements_share_the_plan_with_their_own_pointers(plans_made):
    x, y = np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)
    seen = []
    site = _site(
        lambda out, args, kw: seen.append((id(out[0]), out[0].ptr, args[0].ptr)), 1, (True,)
    )
    _ext.gpu_call_for_tests(site, 0, 0, _buffers(x), _buffers(y))
    assert len(plans_made) == 1 and len({s[0] for s in seen}) == 1
    assert [s[1:] for s in seen] == [
        (y.ctypes.data + 16 * k, x.ctypes.data + 16 * k) for k in range(3)
    ]


def test_a_new_signature_stream_or_device_makes_a_new_plan(plans_made):
    site = _site(lambda out, args, kw: None)
    a4, a5, b4 = np.zeros(4, np.float32), np.zeros(5, np.float32), np.zeros(4, np.float32)
    for stream, device, x in (
        (1, 0, a4),
        (1, 0, b4),
        (1, 0, a5),
        (2, 0, a5),
        (2, 1, a5),
        (2, 1, a5),
    ):
        _ext.gpu_call_for_tests(site, stream, device, _buffers(x), _buffers(x))
    assert len(plans_made) == 4
    assert [p.views[0].shape for p in plans_made] == [(4,), (5,), (5,), (5,)]
    assert [(p.context.stream, p.context.device) for p in plans_made] == [
        (1, 0),
        (1, 0),
        (2, 0),
        (2, 1),
    ]


@pytest.mark.parametrize("keep", ["view", "tuple", "weakly"])
def test_a_kept_view_keeps_its_address_and_the_next_call_gets_new_views(plans_made, keep):
    import weakref

    kept, seen = [], []

    def callable_(out, args, kwargs_dump):
        seen.append(id(out[0]))
        if not kept:
            kept.append({"view": out[0], "tuple": out, "weakly": weakref.ref(out[0])}[keep])

    site = _site(callable_)
    x, y1, y2 = (np.zeros(2, np.float32) for _ in range(3))
    for y in (y1, y2, y2):
        _ext.gpu_call_for_tests(site, 0, 0, _buffers(x), _buffers(y))
    first, second = plans_made  # the second call's plan is reused by the third
    assert seen == [id(first.views[1]), id(second.views[1]), id(second.views[1])]
    view = {"view": lambda k: k, "tuple": lambda k: k[0], "weakly": lambda k: k()}[keep](kept[0])
    assert view is first.views[1] and view.ptr == y1.ctypes.data  # never repointed


def test_a_view_used_and_dropped_inside_the_callable_does_not_count_as_kept(plans_made):
    holders = []

    def callable_(out, args, kwargs_dump):
        holders.append(len(holders))
        wrapped = {"owner": out[0], "also": args}  # as cp.asarray(view) holds its owner
        del wrapped

    site = _site(callable_)
    x = np.zeros(2, np.float32)
    for _ in range(3):
        _ext.gpu_call_for_tests(site, 0, 0, _buffers(x), _buffers(x))
    assert len(plans_made) == 1


def test_a_failing_callable_restores_the_context_and_its_plan_is_not_reused(plans_made):
    def callable_(out, args, kwargs_dump):
        raise ValueError("boom")

    site = _site(callable_)
    x = np.zeros(2, np.float32)
    for _ in range(2):
        with pytest.raises(ValueError, match="boom"):
            _ext.gpu_call_for_tests(site, 0, 0, _buffers(x), _buffers(x))
        assert jaxbind.current_call().platform == "cpu"
    assert len(plans_made) == 2  # the traceback held the views


def test_a_call_that_finds_the_plan_in_use_gets_its_own(plans_made):
    """Two threads in one site's body at once (the body released the GIL), and a nested
    call: each call sees its own addresses, and the waiting call's are not moved."""
    import threading

    inside, go_on = threading.Event(), threading.Event()
    seen = {}

    def callable_(out, args, kwargs_dump):
        name = threading.current_thread().name
        if name == "first":
            inside.set()
            assert go_on.wait(10)  # without the GIL: the second thread runs its call
        seen[name] = (out[0], out[0].ptr)

    site = _site(callable_)
    x, y1, y2 = (np.zeros(2, np.float32) for _ in range(3))
    first = threading.Thread(
        target=_ext.gpu_call_for_tests, args=(site, 0, 0, _buffers(x), _buffers(y1)), name="first"
    )
    first.start()
    assert inside.wait(10)
    second = threading.Thread(
        target=_ext.gpu_call_for_tests, args=(site, 0, 0, _buffers(x), _buffers(y2)), name="second"
    )
    second.start()
    second.join(10)
    go_on.set()
    first.join(10)
    assert seen["first"][1] == y1.ctypes.data and seen["second"][1] == y2.ctypes.data
    assert seen["first"][0] is not seen["second"][0] and len(plans_made) == 2

    nested = []

    def outer(out, args, kwargs_dump):
        if not nested:
            nested.append(None)
            _ext.gpu_call_for_tests(site2, 0, 0, _buffers(x), _buffers(y2))
        nested.append(out[0].ptr)

    site2 = _site(outer)
    _ext.gpu_call_for_tests(site2, 0, 0, _buffers(x), _buffers(y1))
    assert nested == [None, y2.ctypes.data, y1.ctypes.data]
    _ext.gpu_call_for_tests(site2, 0, 0, _buffers(x), _buffers(y2))  # the cached plan again
    assert len(plans_made) == 4


def test_host_mode_plans_are_reused_and_read_the_views_addresses(monkeypatch, plans_made):
    monkeypatch.setattr(_gpu, "_driver", _HostMemoryDriver)

    def add_one(out, args, kwargs_dump):
        out[0][...] = args[0] + 1

    site = _site(add_one, 1, (True,), mode="host")
    for k in range(3):
        x = np.full((2, 3), float(k), np.float32)
        y = np.zeros((2, 3), np.float32)
        _ext.gpu_call_for_tests(site, 0, 0, _buffers(x), _buffers(y))
        np.testing.assert_array_equal(y, x + 1)
    assert len(plans_made) == 1 and isinstance(plans_made[0], _gpu.HostPlan)


class _FakeCuda:
    """The CUDA state of one thread as CuPy and PyTorch show it (current device, each
    device's current stream), behind the few calls of theirs that GPU plans make."""

    def __init__(self):
        self.device, self.streams = 0, {}

    def now(self):
        return self.device, self.streams.get(self.device)

    def cupy(self):
        cuda = self

        class Stream:
            def __init__(self, handle, device):
                self.handle, self.device = handle, device

            @classmethod
            def from_external(cls, ref):
                return cls(ref.__cuda_stream__()[1], cuda.device)

            def use(self):
                cuda.streams[self.device] = self.handle

        @contextlib.contextmanager
        def device(d):
            was, cuda.device = cuda.device, d
            yield
            cuda.device = was

        runtime = types.SimpleNamespace(
            getDevice=lambda: cuda.device, setDevice=lambda d: setattr(cuda, "device", d)
        )
        current = lambda: Stream(cuda.streams.get(cuda.device), cuda.device)
        return types.SimpleNamespace(
            cuda=types.SimpleNamespace(
                runtime=runtime, Stream=Stream, Device=device, get_current_stream=current
            )
        )

    def torch(self):
        cuda = self

        class Stream:
            def __init__(self, handle, device):
                self.handle, self.device = handle, device

        def set_stream(s):
            cuda.device = s.device  # as torch.cuda.set_stream does
            cuda.streams[s.device] = s.handle

        return types.SimpleNamespace(
            device=lambda kind, d: d,
            cuda=types.SimpleNamespace(
                is_available=lambda: True,
                ExternalStream=lambda handle, device: Stream(handle, device),
                current_device=lambda: cuda.device,
                current_stream=lambda d: Stream(cuda.streams.get(d), d),
                set_stream=set_stream,
                set_device=lambda d: setattr(cuda, "device", d),
            ),
        )


@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_xla_stream_and_device_are_current_in_a_framework_imported_later(
    monkeypatch, plans_made, framework
):
    """Device mode: where CuPy or PyTorch is imported (also after the plan was made), the
    plan's device and XLA's stream are current while the callable runs, and restored
    after, also when it raises."""
    fake = _FakeCuda()
    monkeypatch.delitem(sys.modules, framework, raising=False)
    seen = []

    def callable_(out, args, kwargs_dump):
        seen.append(fake.now())
        if len(seen) == 3:
            raise ValueError("boom")

    site = _site(callable_)
    x = np.zeros(2, np.float32)
    _ext.gpu_call_for_tests(site, 77, 1, _buffers(x), _buffers(x))
    monkeypatch.setitem(sys.modules, framework, getattr(fake, framework)())
    _ext.gpu_call_for_tests(site, 77, 1, _buffers(x), _buffers(x))
    assert fake.now() == (0, None) and len(plans_made) == 1
    with pytest.raises(ValueError, match="boom"):
        _ext.gpu_call_for_tests(site, 77, 1, _buffers(x), _buffers(x))
    assert fake.now() == (0, None) and fake.streams[1] is None
    assert seen == [(0, None), (1, 77), (1, 77)]
