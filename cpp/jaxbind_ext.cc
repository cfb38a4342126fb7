// jaxbind's trampoline: one XLA FFI handler that calls a Python callable.
//
// When XLA runs a compiled program and reaches a jaxbind custom call, `Call`
// below takes the GIL, wraps every input buffer as a read-only NumPy array and
// every output buffer as a writable NumPy array (both zero-copy), and calls
//
//     callable(out: tuple, args: tuple, kwargs_dump)
//
// The program does not name the callable by address. Its attributes carry the
// binding's stable name, the role (which of the binding's callables), the
// encoded keyword arguments and a 64-bit digest of the three. The digest keys a
// cache of resolved call sites; on a miss, a Python resolver (set by `init`)
// validates the attributes and returns the callable, which the cache keeps alive.
// Unknown names and Python exceptions become ffi::Error values, never crashes.

#include <array>
#include <memory>
#include <type_traits>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nanobind/stl/vector.h>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

#ifndef JAXBIND_JAXLIB_VERSION
#define JAXBIND_JAXLIB_VERSION "unknown"
#endif

namespace {

// Version of the attribute set a jaxbind custom call carries. Bump it when the
// attributes change, and keep accepting every older value.
constexpr int32_t kCallFormat = 1;
constexpr size_t kNumDtypes = 64;  // upper bound on XLA_FFI_DataType values

struct Site {
  nb::object callable;     // the user's Python callable
  nb::object kwargs_dump;  // decoded keyword arguments, passed through
  nb::object label;        // str naming the binding and role, for errors
  std::string binding;     // binding name, to purge sites of dropped bindings
  // jaxbind's own batching (see _batching): the leading `levels` axes of every
  // output and of each input marked in `batched` are a batch; the callable is
  // called once per batch element. levels == 0: one plain call.
  int levels = 0;
  std::vector<bool> batched;
  // The views of the site's last call, when the callable kept no reference to
  // them: the next call points them at its buffers instead of building new ones.
  nb::object out_views, in_views;
  nb::object platform_mode;  // "device" or "host": how GPU calls reach the callable
};

struct State {
  std::unordered_map<int64_t, std::shared_ptr<Site>> sites;  // shared: a call in flight keeps its site
  std::array<PyArray_Descr*, kNumDtypes> dtypes{};  // owned references
  nb::object resolver;   // (binding, role, kwargs, digest) -> (callable, kwargs_dump, label, loop, mode)
  nb::object formatter;  // (label, type, value, traceback) -> str
  nb::object gpu_dispatch;  // runs a GPU call; see set_gpu_dispatch
};

// Created by init() and deliberately never destroyed: XLA threads may still
// call in while the interpreter shuts down, and the objects held here must not
// be released after Python is gone.
State *state = nullptr;

bool python_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

ffi::Error error(ffi::ErrorCode code, std::string message) {
  return ffi::Error(code, "jaxbind: " + std::move(message));
}

// One buffer as the callable sees it: with levels > 0 and `batched`, batch
// element `element` (the leading `levels` axes dropped) of the buffer.
struct View {
  ffi::DataType type;
  char *data;
  ffi::Span<const int64_t> dims;
};

template <typename Remaining>
View view_of(const Remaining &buffers, size_t i, const char *what, int levels, int64_t element,
             bool batched) {
  auto buf = buffers.template get<ffi::AnyBuffer>(i);
  if (!buf.has_value()) throw std::runtime_error(std::string("cannot decode ") + what);
  ffi::AnyBuffer b = [&]() -> ffi::AnyBuffer {
    if constexpr (std::is_same_v<Remaining, ffi::RemainingRets>) return **buf;
    else return *buf;
  }();
  View v{b.element_type(), static_cast<char *>(b.untyped_data()), b.dimensions()};
  if (levels > 0 && batched) {
    int64_t elem_bytes = static_cast<int64_t>(ffi::ByteWidth(v.type));
    for (size_t d = levels; d < v.dims.size(); ++d) elem_bytes *= v.dims[d];
    v.data += element * elem_bytes;
    v.dims = ffi::Span<const int64_t>(v.dims.begin() + levels, v.dims.size() - levels);
  }
  return v;
}

// A new C-contiguous NumPy array over the view's memory (zero-copy).
PyObject *wrap(const View &v, bool writeable, const char *what, size_t index) {
  auto code = static_cast<size_t>(v.type);
  PyArray_Descr *descr = code < kNumDtypes ? state->dtypes[code] : nullptr;
  if (descr == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s %zu has XLA element type %zu, which jaxbind cannot wrap",
                 what, index, code);
    throw nb::python_error();
  }
  if (v.dims.size() > NPY_MAXDIMS) {
    PyErr_Format(PyExc_ValueError, "%s %zu has rank %zu; NumPy allows at most %d", what, index,
                 v.dims.size(), NPY_MAXDIMS);
    throw nb::python_error();
  }
  npy_intp shape[NPY_MAXDIMS];
  for (size_t i = 0; i < v.dims.size(); ++i) shape[i] = static_cast<npy_intp>(v.dims[i]);
  Py_INCREF(descr);  // PyArray_NewFromDescr steals it
  PyObject *array = PyArray_NewFromDescr(&PyArray_Type, descr, static_cast<int>(v.dims.size()),
                                         shape, nullptr, v.data,
                                         writeable ? NPY_ARRAY_CARRAY : NPY_ARRAY_CARRAY_RO,
                                         nullptr);
  if (array == nullptr) throw nb::python_error();
  return array;
}

// Point a view of an earlier call at new memory, if nothing else holds it and
// it still has the dtype, shape and strides `wrap` would give it.
bool repoint(PyObject *obj, const View &v, bool writeable) {
  auto *array = reinterpret_cast<PyArrayObject *>(obj);
  auto code = static_cast<size_t>(v.type);
  if (Py_REFCNT(obj) != 1 || code >= kNumDtypes || PyArray_DESCR(array) != state->dtypes[code] ||
      PyArray_NDIM(array) != static_cast<int>(v.dims.size()))
    return false;
  npy_intp stride = PyArray_ITEMSIZE(array);
  for (int d = static_cast<int>(v.dims.size()) - 1; d >= 0; --d) {
    if (PyArray_DIM(array, d) != v.dims[d] || PyArray_STRIDE(array, d) != stride) return false;
    if (v.dims[d] != 0) stride *= v.dims[d];
  }
  reinterpret_cast<PyArrayObject_fields *>(obj)->data = v.data;
  if (writeable) PyArray_ENABLEFLAGS(array, NPY_ARRAY_WRITEABLE);
  else PyArray_CLEARFLAGS(array, NPY_ARRAY_WRITEABLE);
  return true;
}

// A tuple of views over all of XLA's argument or result buffers. `cache` holds
// the tuple of the site's last call, if any; it is taken (so that a nested or
// concurrent call of the same site builds its own) and reused where it fits.
template <typename Remaining>
nb::object views(nb::object &cache, const Remaining &buffers, bool writeable, const char *what,
                 int levels = 0, int64_t element = 0, const std::vector<bool> &batched = {}) {
  nb::object tuple = std::move(cache);
  auto n = static_cast<Py_ssize_t>(buffers.size());
  if (!tuple.is_valid() || Py_REFCNT(tuple.ptr()) != 1 || PyTuple_GET_SIZE(tuple.ptr()) != n) {
    PyObject *fresh = PyTuple_New(n);
    if (fresh == nullptr) throw nb::python_error();
    tuple = nb::steal(fresh);
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    View v = view_of(buffers, i, what, levels, element, batched.empty() || batched[i]);
    PyObject *old = PyTuple_GET_ITEM(tuple.ptr(), i);
    if (old != nullptr && repoint(old, v, writeable)) continue;
    PyTuple_SET_ITEM(tuple.ptr(), i, wrap(v, writeable, what, i));
    Py_XDECREF(old);
  }
  return tuple;
}

// Number of batch elements: the product of the leading `levels` axes of output 0.
int64_t batch_size(const ffi::RemainingRets &rets, int levels) {
  auto buf = rets.get<ffi::AnyBuffer>(0);
  if (!buf.has_value()) throw std::runtime_error("cannot decode output");
  auto dims = (**buf).dimensions();
  int64_t n = 1;
  for (int d = 0; d < levels; ++d) n *= dims[d];
  return n;
}

// After the call, the views point at memory XLA will reuse. Make the output
// views read-only, so that a reference the callable kept cannot write into
// later results, and warn when the callable kept one. Returns whether it kept
// one; throws if the warning was turned into an exception.
bool release_views(const nb::object &outs, const nb::object &ins, const Site &site) {
  bool kept = Py_REFCNT(outs.ptr()) > 1 || Py_REFCNT(ins.ptr()) > 1;
  for (nb::handle view : nb::borrow<nb::tuple>(outs)) {
    PyArray_CLEARFLAGS(reinterpret_cast<PyArrayObject *>(view.ptr()), NPY_ARRAY_WRITEABLE);
    kept |= Py_REFCNT(view.ptr()) > 1;
  }
  for (nb::handle view : nb::borrow<nb::tuple>(ins)) kept |= Py_REFCNT(view.ptr()) > 1;
  if (!kept) return false;
  std::string text = "jaxbind: the callable of " + nb::cast<std::string>(nb::str(site.label)) +
                     " kept a reference to its input or output arrays after returning; they "
                     "are views of XLA buffers, valid only during the call (copy what you need)";
  if (PyErr_WarnEx(PyExc_RuntimeWarning, text.c_str(), 1) != 0) throw nb::python_error();
  return true;
}

// Find the call site named by the attributes, asking the resolver on a miss.
std::shared_ptr<Site> resolve(int64_t digest, std::string_view binding, std::string_view role,
                              ffi::Span<const uint8_t> kwargs) {
  auto it = state->sites.find(digest);
  if (it != state->sites.end()) return it->second;
  nb::object found = state->resolver(
      nb::str(binding.data(), binding.size()), nb::str(role.data(), role.size()),
      nb::bytes(reinterpret_cast<const char *>(kwargs.begin()), kwargs.size()), digest);
  auto parts = nb::cast<nb::tuple>(found);
  auto site = std::make_shared<Site>();
  site->callable = parts[0];
  site->kwargs_dump = parts[1];
  site->label = parts[2];
  site->binding = std::string(binding);
  site->platform_mode = parts.size() > 4 ? nb::object(parts[4]) : nb::object(nb::str("device"));
  if (!parts[3].is_none()) {
    auto loop = nb::cast<nb::tuple>(parts[3]);
    site->levels = nb::cast<int>(loop[0]);
    for (nb::handle b : nb::cast<nb::tuple>(loop[1])) site->batched.push_back(nb::cast<bool>(b));
  }
  return state->sites.emplace(digest, std::move(site)).first->second;
}

template <typename T>
bool get_attr(const ffi::Dictionary &attrs, std::string_view name, T &out) {
  auto value = attrs.get<T>(name);
  if (!value.has_value()) return false;
  out = *value;
  return true;
}

// What every jaxbind call does around its platform's body: check the call
// format, decode the attributes, take the GIL, resolve the site, and turn
// every failure into an ffi::Error that names the binding.
template <typename Body>
ffi::Error guarded(const ffi::Dictionary &attrs, Body &&body) {
  int32_t format = 0;
  if (!get_attr(attrs, "jaxbind_format", format))
    return error(ffi::ErrorCode::kInvalidArgument,
                 "custom call has no 'jaxbind_format' attribute; it was not made by jaxbind");
  if (format < 1 || format > kCallFormat)
    return error(ffi::ErrorCode::kUnimplemented,
                 "program uses jaxbind call format " + std::to_string(format) +
                     ", but this jaxbind reads formats 1 to " + std::to_string(kCallFormat) +
                     "; upgrade jaxbind to run it");
  int64_t digest = 0;  // signed: jax 0.7 cannot lower uint64 attributes above 2**63
  std::string_view binding, role;
  ffi::Span<const uint8_t> kwargs;
  if (!get_attr(attrs, "site", digest) || !get_attr(attrs, "binding", binding) ||
      !get_attr(attrs, "role", role) || !get_attr(attrs, "kwargs", kwargs))
    return error(ffi::ErrorCode::kInvalidArgument,
                 "custom call lacks one of the attributes 'site', 'binding', 'role', 'kwargs' "
                 "that call format 1 requires");
  if (state == nullptr || !Py_IsInitialized() || python_is_finalizing())
    return error(ffi::ErrorCode::kUnavailable, "the Python interpreter is not running");

  nb::gil_scoped_acquire gil;
  nb::object label;
  try {
    std::shared_ptr<Site> site = resolve(digest, binding, role, kwargs);
    label = site->label;
    body(*site);
    return ffi::Error::Success();
  } catch (nb::python_error &e) {
    std::string message;
    try {
      nb::object where = label.is_valid() ? label : nb::str(binding.data(), binding.size());
      message = nb::cast<std::string>(
          state->formatter(where, e.type(), e.value(), e.traceback()));
    } catch (...) {
      message = std::string("jaxbind: callable of '") + std::string(binding) + "' failed: " + e.what();
    }
    return ffi::Error(ffi::ErrorCode::kInternal, message);
  } catch (std::exception &e) {
    return error(ffi::ErrorCode::kInternal, "'" + std::string(binding) + "': " + e.what());
  } catch (...) {
    return error(ffi::ErrorCode::kInternal, "'" + std::string(binding) + "': unknown C++ exception");
  }
}

// CPU: NumPy views of the host buffers, the callable called in place.
ffi::Error Call(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return guarded(attrs, [&](Site &site) {
    int64_t n = site.levels > 0 ? batch_size(rets, site.levels) : 1;
    for (int64_t k = 0; k < n; ++k) {
      nb::object outs = views(site.out_views, rets, true, "output", site.levels, k);
      nb::object ins = views(site.in_views, args, false, "input", site.levels, k, site.batched);
      PyObject *argv[3] = {outs.ptr(), ins.ptr(), site.kwargs_dump.ptr()};
      PyObject *result = PyObject_Vectorcall(site.callable.ptr(), argv, 3, nullptr);
      if (result == nullptr) throw nb::python_error();
      Py_DECREF(result);
      if (!release_views(outs, ins, site)) {  // nothing kept: reuse them next time
        site.out_views = std::move(outs);
        site.in_views = std::move(ins);
      }
    }
  });
}

// GPU buffers as Python sees them: a tuple of (device pointer, shape, XLA element type).
template <typename Remaining>
nb::object describe(const Remaining &buffers, const char *what) {
  nb::list items;
  for (size_t i = 0; i < buffers.size(); ++i) {
    View v = view_of(buffers, i, what, 0, 0, false);
    nb::list shape;
    for (int64_t d : v.dims) shape.append(d);
    items.append(nb::make_tuple(reinterpret_cast<uintptr_t>(v.data), nb::tuple(shape),
                                static_cast<int>(v.type)));
  }
  return nb::tuple(items);
}

// CUDA: the device buffers and XLA's stream go to the Python dispatcher (see
// jaxbind/_gpu.py), which wraps them as zero-copy CUDA arrays, or copies them
// to the host for a binding in host mode, and calls the callable. No CUDA
// header or library is needed here: the stream is an opaque pointer.
ffi::Error CallCuda(void *stream, int32_t device, ffi::RemainingArgs args,
                    ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return guarded(attrs, [&](Site &site) {
    if (!state->gpu_dispatch.is_valid()) throw std::runtime_error("no GPU dispatcher is set");
    nb::tuple batched;
    {
      nb::list flags;
      for (bool b : site.batched) flags.append(b);
      batched = nb::tuple(flags);
    }
    state->gpu_dispatch(site.callable, site.kwargs_dump, site.label, site.platform_mode,
                        site.levels, batched, reinterpret_cast<uintptr_t>(stream), device,
                        describe(args, "input"), describe(rets, "output"));
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cpu_handler, Call,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()    // inputs, any dtype and rank
                                  .RemainingRets()    // outputs, written in place
                                  .Attrs<ffi::Dictionary>());  // jaxbind_format, site, binding, role, kwargs

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cuda_handler, CallCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()  // XLA's CUDA stream
                                  .Ctx<ffi::DeviceOrdinal>()           // the device's ordinal
                                  .RemainingArgs()    // inputs, device memory
                                  .RemainingRets()    // outputs, device memory, written in place
                                  .Attrs<ffi::Dictionary>());  // as on the CPU

NB_MODULE(_ext, m) {
  if (_import_array() < 0) throw nb::python_error();

  m.attr("call_format") = kCallFormat;
  m.attr("jaxlib_version") = JAXBIND_JAXLIB_VERSION;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);

  m.def("cpu_handler", []() { return nb::capsule(reinterpret_cast<void *>(jaxbind_cpu_handler)); },
        "PyCapsule of the CPU FFI handler, for jax.ffi.register_ffi_target.");
  m.def("cuda_handler", []() { return nb::capsule(reinterpret_cast<void *>(jaxbind_cuda_handler)); },
        "PyCapsule of the CUDA FFI handler (built without the CUDA toolkit).");
  m.def(
      "dlpack_view",
      [](uintptr_t pointer, std::vector<size_t> shape, uint8_t code, uint8_t bits,
         int32_t device_type, int32_t device_id, nb::handle owner) {
        nb::dlpack::dtype dtype{code, bits, 1};
        nb::ndarray<> view(reinterpret_cast<void *>(pointer), shape.size(), shape.data(), owner,
                           nullptr, dtype, device_type, device_id);
        return nb::cast(view);
      },
      nb::arg("pointer"), nb::arg("shape"), nb::arg("code"), nb::arg("bits"),
      nb::arg("device_type"), nb::arg("device_id"), nb::arg("owner"),
      "A zero-copy DLPack-capable array over memory jaxbind does not own (`owner` keeps "
      "whatever must outlive it alive).");
  m.def(
      "set_gpu_dispatch", [](nb::object dispatch) {
        if (state == nullptr) state = new State();
        state->gpu_dispatch = dispatch;
      },
      nb::arg("dispatch"),
      "Set the Python function that runs GPU calls: (callable, kwargs_dump, label, "
      "platform_mode, levels, batched, stream, device, inputs, outputs), each buffer as "
      "(pointer, shape, element type).");

  m.def(
      "init",
      [](nb::dict dtypes, nb::object resolver, nb::object formatter) {
        if (state == nullptr) state = new State();
        for (auto [key, value] : dtypes) {
          auto code = nb::cast<size_t>(key);
          if (code >= kNumDtypes) throw nb::value_error("XLA element type out of range");
          PyArray_Descr *descr = nullptr;
          if (!PyArray_DescrConverter(value.ptr(), &descr)) throw nb::python_error();
          Py_XDECREF(state->dtypes[code]);
          state->dtypes[code] = descr;
        }
        state->resolver = resolver;
        state->formatter = formatter;
      },
      nb::arg("dtypes"), nb::arg("resolver"), nb::arg("formatter"),
      "Set the dtype table {XLA element type: numpy dtype}, the site resolver and the "
      "error formatter.");

  m.def(
      "forget",
      [](std::string_view binding) {
        if (state == nullptr) return size_t(0);
        size_t removed = 0;
        for (auto it = state->sites.begin(); it != state->sites.end();) {
          if (it->second->binding == binding) {
            it = state->sites.erase(it);
            ++removed;
          } else {
            ++it;
          }
        }
        return removed;
      },
      nb::arg("binding"), "Drop the cached call sites of a binding; returns how many.");

  m.def(
      "site_count", []() { return state == nullptr ? size_t(0) : state->sites.size(); },
      "Number of resolved call sites held by the trampoline.");
}
