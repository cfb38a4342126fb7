// jaxbind's trampoline: the XLA FFI handlers that call a Python callable.
//
// Files: state.h (call sites, their cache and tables), views.h (NumPy views of host
// buffers), and this file (the CPU and CUDA handlers and the module).
//
// When XLA runs a compiled program and reaches a jaxbind custom call on the
// CPU, `Call` below takes the GIL, wraps every input buffer as a read-only NumPy array and
// every output buffer as a writable NumPy array (both zero-copy), and calls
//
//     callable(out: tuple, args: tuple, kwargs_dump)
//
// The program does not name the callable by address. Its attributes (call
// format 3, see jaxbind/_callformat.py) carry the binding's stable name, the
// role, the encoded keyword arguments, jaxbind's batch loop and a 64-bit digest
// of them all. The digest keys a cache of resolved call sites; on a miss, the
// Python resolver (jaxbind/_runtime.py, set by `init`) checks the attributes and
// returns a Site, which its binding owns and the cache holds weakly. Before the
// callable runs, the buffers are checked against the loop and, once per new
// set of shapes, against the binding's abstract function (`check_buffers`).
// Unknown names, bad programs and Python exceptions become ffi::Error values,
// never crashes.
// On CUDA, `CallCuda` hands the device pointers and XLA's stream to Python
// (jaxbind/_gpu.py); it needs no CUDA header or library.

#include "kernels.h"
#include "state.h"
#include "views.h"

#include <algorithm>
#include <chrono>
#include <thread>

#if defined(__GLIBCXX__)
#include <cxxabi.h>  // abi::__forced_unwind
#endif

namespace jaxbind {

inline Site &site_of(PyObject *obj) { return *nb::inst_ptr<Site>(nb::handle(obj)); }

// Find the call site named by the attributes. A cached site needs only the
// digest; on a miss the resolver checks every attribute and returns a Site,
// which its binding owns. Returns a strong reference: the call keeps its site
// alive even if the callable drops the last other reference to the binding.
nb::object resolve(CallAttributes &call, const ffi::Dictionary &attrs) {
  auto it = state->sites.find(call.site);
  if (it != state->sites.end()) return nb::borrow(it->second.site);
  call.read_rest(attrs);
  auto bytes = [](ffi::Span<const uint8_t> span) {
    return nb::bytes(reinterpret_cast<const char *>(span.begin()), span.size());
  };
  nb::object found =
      state->resolver(call.format, nb::str(call.binding.data(), call.binding.size()),
                      nb::str(call.role.data(), call.role.size()), bytes(call.kwargs), call.site,
                      call.levels, bytes(call.flags), call.n_fixed, bytes(call.trees));
  if (!nb::isinstance<Site>(found)) throw std::runtime_error("the resolver returned no Site");
  Site &site = site_of(found.ptr());
  if (site.levels < 0 || site.levels > 64)
    throw std::invalid_argument("the call's batch levels are out of range");
  // When the site is freed (with its binding), the weak reference's callback
  // drops the entry, unless the digest has meanwhile been given to another site.
  int64_t digest = call.site;
  KernelRef kernel = site.kernel;
  nb::object forget = nb::cpp_function([digest, kernel](nb::handle ref) {
    if (state == nullptr) return;
    auto entry = state->sites.find(digest);
    if (entry != state->sites.end() && entry->second.ref.ptr() == ref.ptr())
      state->sites.erase(entry);
    if (!kernel) return;
    std::lock_guard lock(kernel_mu);
    auto ks = kernel_sites.find(digest);
    if (ks != kernel_sites.end() && ks->second == kernel) kernel_sites.erase(ks);
    kernel->alive.store(false, std::memory_order_release);
  });
  nb::weakref ref(found, forget);
  // The resolver ran Python, so another thread may have resolved the same digest
  // meanwhile: its site stays the one (replacing the entry would drop the weak reference
  // whose callback marks that site's kernel dead when its binding goes).
  auto again = state->sites.find(digest);
  if (again != state->sites.end()) return nb::borrow(again->second.site);
  state->sites.emplace(digest, Entry{found.ptr(), std::move(ref)});
  if (site.kernel) {
    std::lock_guard lock(kernel_mu);
    kernel_sites.insert_or_assign(digest, site.kernel);
  }
  return found;
}

// Buffer signature: for each input, then each output, its element type, rank and
// dimensions. `known` holds the signatures the site's check accepted.
template <typename Remaining>
bool signature_part_matches(const Remaining &buffers, const std::vector<int64_t> &sig,
                            size_t &pos) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    ffi::AnyBuffer b = buffer_at(buffers, i, "buffer");
    auto dims = b.dimensions();
    if (pos + 2 + dims.size() > sig.size() || sig[pos] != static_cast<int64_t>(b.element_type()) ||
        sig[pos + 1] != static_cast<int64_t>(dims.size()))
      return false;
    pos += 2;
    for (int64_t d : dims)
      if (sig[pos++] != d) return false;
  }
  return true;
}

template <typename Remaining>
void append_signature(const Remaining &buffers, std::vector<int64_t> &sig, nb::list &described,
                      const char *what) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    ffi::AnyBuffer b = buffer_at(buffers, i, what);
    auto dims = b.dimensions();
    sig.push_back(static_cast<int64_t>(b.element_type()));
    sig.push_back(static_cast<int64_t>(dims.size()));
    nb::list shape;
    for (int64_t d : dims) {
      sig.push_back(d);
      shape.append(d);
    }
    described.append(nb::make_tuple(nb::tuple(shape), static_cast<int>(b.element_type())));
  }
}

// Check the buffers XLA hands over against what the binding's abstract function
// declares for them (the site's `check`, once per new signature).
void check_buffers(Site &site, const Args &args, const Rets &rets) {
  for (auto it = site.known.rbegin(); it != site.known.rend(); ++it) {
    size_t pos = 0;
    if (signature_part_matches(args, *it, pos) && signature_part_matches(rets, *it, pos) &&
        pos == it->size()) {
      if (it != site.known.rbegin()) {  // least recently used goes first: move it last
        auto hit = std::prev(it.base());
        std::rotate(hit, hit + 1, site.known.end());
      }
      return;
    }
  }
  std::vector<int64_t> sig;
  nb::list ins, outs;
  append_signature(args, sig, ins, "input");
  append_signature(rets, sig, outs, "output");
  nb::object problem = site.check(nb::tuple(ins), nb::tuple(outs));
  if (!problem.is_none()) throw std::invalid_argument(nb::cast<std::string>(problem));
  if (site.known.size() >= kKnownSignatures) site.known.erase(site.known.begin());
  site.known.push_back(std::move(sig));
}

// What every jaxbind call does around its platform's body: check the call
// format, decode the attributes, take the GIL, resolve the site, and turn
// every failure into an ffi::Error that names the binding.
template <typename Body>
ffi::Error guarded(const ffi::Dictionary &attrs, Body &&body) {
  CallAttributes call;
  CallAttributes::Problem problem = call.read_header(attrs);
  if (!problem.message.empty()) return error(problem.code, problem.message);
  InFlight running;  // counted before the check below: see `shutdown`
  if (state == nullptr || python_is_finalizing())
    return error(ffi::ErrorCode::kUnavailable, "the Python interpreter is not running");

  nb::gil_scoped_acquire gil;
  nb::object site;
  // For messages: the binding's name, from the site or (before one is found) the attributes.
  auto name = [&]() -> std::string {
    if (site.is_valid()) return site_of(site.ptr()).binding;
    std::string_view binding = "?";
    get_attr(attrs, "binding", binding);
    return std::string(binding);
  };
  try {
    site = resolve(call, attrs);
    body(site_of(site.ptr()));
    return ffi::Error::Success();
  } catch (nb::python_error &e) {
    if (e.matches(PyExc_KeyboardInterrupt)) {
      // Ctrl-C while the callable ran: the call fails, and the interrupt is raised again
      // so that the main thread sees a KeyboardInterrupt at its next bytecode, as a
      // Ctrl-C anywhere else in Python.
      PyErr_SetInterrupt();
      return error(ffi::ErrorCode::kCancelled,
                   "'" + name() + "' was interrupted (KeyboardInterrupt) while its callable ran");
    }
    std::string message;
    try {
      nb::object where =
          site.is_valid() ? site_of(site.ptr()).label : nb::object(nb::str(name().c_str()));
      message = nb::cast<std::string>(state->formatter(where, e.type(), e.value(), e.traceback()));
#if defined(__GLIBCXX__)
    } catch (abi::__forced_unwind &) {
      throw;
#endif
    } catch (...) {
      message = "jaxbind: callable of '" + name() + "' failed: " + e.what();
    }
    return ffi::Error(ffi::ErrorCode::kInternal, message);
  } catch (KernelError &e) {
    return error(ffi::ErrorCode::kInternal, e.what());
  } catch (std::invalid_argument &e) {
    return error(ffi::ErrorCode::kInvalidArgument, "'" + name() + "': " + e.what());
  } catch (std::exception &e) {
    return error(ffi::ErrorCode::kInternal, "'" + name() + "': " + e.what());
#if defined(__GLIBCXX__)
  } catch (abi::__forced_unwind &) {
    throw;  // a thread ended at interpreter exit unwinds through here: never swallow it
#endif
  } catch (...) {
    return error(ffi::ErrorCode::kInternal, "'" + name() + "': unknown C++ exception");
  }
}

// A kernel site's call with the GIL held (its first call, or a new buffer signature):
// the buffers checked by the site's Python check, the kernel's address for their
// signature looked up, then the kernel run without the GIL.
void call_kernel_site(Site &site, const Args &args, const Rets &rets) {
  KernelSite &ks = *site.kernel;
  std::vector<jaxbind_buffer> ins, outs;
  describe_buffers(args, "input", ins);
  describe_buffers(rets, "output", outs);
  if (ks.levels > 0) kernel_batch_size(ks, ins, outs);  // the loop's checks, before Python's
  check_buffers(site, args, rets);
  KernelCache &cache = kernel_cache();
  jaxbind_kernel_fn fn = find_kernel(ks, ins, outs, cache);
  if (fn == nullptr) {
    std::vector<int64_t> sig;
    nb::list unused_in, unused_out;
    append_signature(args, sig, unused_in, "input");
    append_signature(rets, sig, unused_out, "output");
    // The kernel sees what it is called with: with jaxbind's loop, one batch element.
    bool loop = ks.levels > 0 && !ks.batches;
    std::vector<jaxbind_buffer> in_k, out_k;
    element_of(ins, loop ? ks.levels : 0, 0, ks.batched.data(), in_k);
    element_of(outs, loop ? ks.levels : 0, 0, nullptr, out_k);
    auto described = [](const std::vector<jaxbind_buffer> &buffers) {
      nb::list items;
      for (const jaxbind_buffer &b : buffers) {
        nb::list shape;
        for (int64_t d = 0; d < b.rank; ++d) shape.append(b.dims[d]);
        items.append(nb::make_tuple(nb::tuple(shape), b.dtype));
      }
      return nb::tuple(items);
    };
    auto address = nb::cast<uintptr_t>(site.kernel_address(described(in_k), described(out_k)));
    if (address == 0) throw std::runtime_error("the kernel's address is 0");
    fn = reinterpret_cast<jaxbind_kernel_fn>(address);
    ks.add(std::move(sig), fn);
  }
  nb::gil_scoped_release release;
  run_kernel(ks, fn, ins, outs, cache);
}

// A kernel call whose site and buffer signature are known: no GIL, no Python object.
// Returns false when the call needs the GIL path (see call_kernel_site).
bool call_kernel_fast(const RawAttrs &attrs, const ffi::RemainingArgs &args,
                      const ffi::RemainingRets &rets, ffi::Error &result) {
  int64_t digest = 0;
  if (!attrs.site(digest)) return false;
  KernelCache &cache = kernel_cache();
  KernelSite *ks = find_kernel_site(digest, cache);
  if (ks == nullptr) return false;  // (a kernel site's format was checked when resolved)
  try {
    std::vector<jaxbind_buffer> &ins = cache.ins, &outs = cache.outs;
    describe_all(args, "input", ins);
    describe_all(rets, "output", outs);
    jaxbind_kernel_fn fn = find_kernel(*ks, ins, outs, cache);
    if (fn == nullptr) return false;
    run_kernel(*ks, fn, ins, outs, cache);
    result = ffi::Error::Success();
  } catch (KernelError &e) {
    result = error(ffi::ErrorCode::kInternal, e.what());
  } catch (std::invalid_argument &e) {
    result = error(ffi::ErrorCode::kInvalidArgument, ks->label + ": " + e.what());
  } catch (std::exception &e) {
    result = error(ffi::ErrorCode::kInternal, ks->label + ": " + e.what());
  }
  return true;
}

// CPU: NumPy views of the host buffers, the callable called in place; or a kernel.
ffi::Error Call(ffi::RemainingArgs all_args, ffi::RemainingRets all_rets, RawAttrs raw) {
  ffi::Error result = ffi::Error::Success();
  if (call_kernel_fast(raw, all_args, all_rets, result)) return result;
  return guarded(raw.dict(), [&](Site &site) {
    Args args(all_args);
    Rets rets(all_rets);
    if (site.kernel) return call_kernel_site(site, args, rets);
    int64_t n = site.levels > 0 ? batch_size(site, args, rets) : 1;
    check_buffers(site, args, rets);
    for (int64_t k = 0; k < n; ++k) {
      nb::object outs = views(site.out_views, rets, true, "output", site.levels, k);
      nb::object ins = views(site.in_views, args, false, "input", site.levels, k, site.batched);
      PyObject *argv[3] = {outs.ptr(), ins.ptr(), site.kwargs_dump.ptr()};
      PyObject *result = PyObject_Vectorcall(site.callable.ptr(), argv, 3, nullptr);
      if (result == nullptr) {
        nb::python_error raised;         // takes the exception; the views can then be released
        release_views(outs, ins, site);  // a view the callable kept gets its own copy
        throw raised;
      }
      if (result != Py_None) {  // the commonest mistake: returning the result
        nb::object returned = nb::steal(result);
        release_views(outs, ins, site);
        std::string what = nb::cast<std::string>(nb::type_name(returned.type()));
        PyErr_Format(PyExc_TypeError, "%s",
                     ("the callable returned a " + what +
                      " instead of None. A callable of "
                      "get_linear_call / get_nonlinear_call writes each result into its "
                      "output array, out[k][...] = result, and returns nothing; to return "
                      "results instead, define the op with the JAX-native API "
                      "(jaxbind.linear_op, multilinear_op, nonlinear_op)")
                         .c_str());
        throw nb::python_error();
      }
      Py_DECREF(result);
      if (!release_views(outs, ins, site)) {  // nothing kept: reuse them next time
        cache_views(site.out_views, std::move(outs));
        cache_views(site.in_views, std::move(ins));
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
ffi::Error CallCuda(void *stream, int32_t device, ffi::RemainingArgs all_args,
                    ffi::RemainingRets all_rets, ffi::Dictionary attrs) {
  return guarded(attrs, [&](Site &site) {
    Args args(all_args);
    Rets rets(all_rets);
    if (!state->gpu_dispatch.is_valid()) throw std::runtime_error("no GPU dispatcher is set");
    if (site.kernel)
      throw std::invalid_argument(
          "its body is a CPU kernel, which cannot run in a GPU program (jaxbind's GPU kernels "
          "are not built yet); run the program on the CPU");
    if (site.levels > 0) batch_size(site, args, rets);  // the same checks as on the CPU
    check_buffers(site, args, rets);
    nb::list flags;
    for (bool b : site.batched) flags.append(b);
    state->gpu_dispatch(site.callable, site.kwargs_dump, site.platform_mode, site.levels,
                        nb::tuple(flags), reinterpret_cast<uintptr_t>(stream), device,
                        describe(args, "input"), describe(rets, "output"));
  });
}

// The garbage collector's view of a Site: everything it holds that can lead
// back to user objects (nanobind's recipe for cyclic garbage collection).
int site_traverse(PyObject *self, visitproc visit, void *arg) {
#if PY_VERSION_HEX >= 0x03090000
  Py_VISIT(Py_TYPE(self));
#endif
  if (!nb::inst_ready(self)) return 0;
  Site &s = site_of(self);
  Py_VISIT(s.callable.ptr());
  Py_VISIT(s.kwargs_dump.ptr());
  Py_VISIT(s.label.ptr());
  Py_VISIT(s.check.ptr());
  Py_VISIT(s.platform_mode.ptr());
  Py_VISIT(s.kernel_address.ptr());
  return 0;
}

int site_clear(PyObject *self) {
  Site &s = site_of(self);
  s.callable.reset();
  s.kwargs_dump.reset();
  s.check.reset();
  s.kernel_address.reset();
  s.out_views.reset();
  s.in_views.reset();
  return 0;
}

}  // namespace jaxbind

using namespace jaxbind;

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxbind_cpu_handler, Call,
    ffi::Ffi::Bind()
        .RemainingArgs()      // inputs, any dtype and rank
        .RemainingRets()      // outputs, written in place
        .Attrs<RawAttrs>());  // jaxbind_format, site, binding, role, kwargs, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cuda_handler, CallCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()  // XLA's CUDA stream
                                  .Ctx<ffi::DeviceOrdinal>()           // the device's ordinal
                                  .RemainingArgs()                     // inputs, device memory
                                  .RemainingRets()  // outputs, device memory, written in place
                                  .Attrs<ffi::Dictionary>());  // as on the CPU

NB_MODULE(_ext, m) {
  if (_import_array() < 0) throw nb::python_error();
  // Sites of bindings that live until exit (module-level ops) are still alive when
  // the interpreter shuts down, on purpose (see State): not leaks worth reporting.
  nb::set_leak_warnings(false);

  m.attr("call_format") = kCallFormat;
  m.attr("jaxlib_version") = JAXBIND_JAXLIB_VERSION;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);

  m.def(
      "cpu_handler", []() { return nb::capsule(reinterpret_cast<void *>(jaxbind_cpu_handler)); },
      "PyCapsule of the CPU FFI handler, for jax.ffi.register_ffi_target.");
  m.def(
      "cuda_handler", []() { return nb::capsule(reinterpret_cast<void *>(jaxbind_cuda_handler)); },
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
  static PyType_Slot site_slots[] = {{Py_tp_traverse, reinterpret_cast<void *>(site_traverse)},
                                     {Py_tp_clear, reinterpret_cast<void *>(site_clear)},
                                     {0, nullptr}};
  nb::class_<Site>(m, "Site", nb::type_slots(site_slots), nb::is_weak_referenceable(),
                   "One resolved call site (made by jaxbind._runtime.resolve_site).")
      .def(
          "__init__",
          [](Site *self, nb::object callable, nb::object kwargs_dump, nb::object label,
             std::string binding, int levels, std::vector<bool> batched, nb::object platform_mode,
             nb::object check, nb::object kernel) {
            new (self) Site();
            if (!kernel.is_none()) {
              self->kernel =
                  make_kernel_site(kernel, nb::cast<std::string>(label), levels, batched);
              self->kernel_address = kernel.attr("address");
            }
            self->callable = callable;
            self->kwargs_dump = kwargs_dump;
            self->label = label;
            self->binding = std::move(binding);
            self->levels = levels;
            self->batched = std::move(batched);
            self->platform_mode = platform_mode;
            self->check = check;
          },
          nb::arg("callable"), nb::arg("kwargs_dump"), nb::arg("label"), nb::arg("binding"),
          nb::arg("levels"), nb::arg("batched"), nb::arg("platform_mode"), nb::arg("check"),
          nb::arg("kernel") = nb::none())
      .def_prop_ro("binding", [](const Site &s) { return s.binding; })
      .def_prop_ro("levels", [](const Site &s) { return s.levels; })
      .def_prop_ro("batched", [](const Site &s) { return s.batched; })
      .def_prop_ro("known_signatures", [](const Site &s) { return s.known.size(); })
      .def_prop_ro("is_kernel", [](const Site &s) { return static_cast<bool>(s.kernel); });

  m.def(
      "set_gpu_dispatch",
      [](nb::object dispatch) {
        if (state == nullptr) state = new State();
        state->gpu_dispatch = dispatch;
      },
      nb::arg("dispatch"),
      "Set the Python function that runs GPU calls: (callable, kwargs_dump, "
      "platform_mode, levels, batched, stream, device, inputs, outputs), each buffer as "
      "(pointer, shape, element type).");

  m.def(
      "init",
      [](nb::dict dtypes, nb::object resolver, nb::object formatter, nb::object gpu_dispatch) {
        if (state == nullptr) state = new State();
        for (auto [key, value] : dtypes) {
          auto code = nb::cast<size_t>(key);
          if (code >= kNumDtypes) throw nb::value_error("XLA element type out of range");
          PyArray_Descr *descr = nullptr;
          if (!PyArray_DescrConverter(value.ptr(), &descr)) throw nb::python_error();
          Py_XDECREF(reinterpret_cast<PyObject *>(state->dtypes[code]));
          state->dtypes[code] = descr;
        }
        state->resolver = resolver;
        state->formatter = formatter;
        state->gpu_dispatch = gpu_dispatch;
      },
      nb::arg("dtypes"), nb::arg("resolver"), nb::arg("formatter"), nb::arg("gpu_dispatch"),
      "Set the dtype table {XLA element type: numpy dtype}, the site resolver, the error "
      "formatter and the GPU dispatcher (see jaxbind/_runtime.py).");

  m.def(
      "set_view_hooks",
      [](nb::object collect_garbage, nb::object escaped) {
        if (state == nullptr) state = new State();
        state->collect_garbage = collect_garbage;
        state->escaped = escaped;
      },
      nb::arg("collect_garbage"), nb::arg("escaped"),
      "Set what runs when a callable kept a view: collect_garbage() drops JAX's lingering "
      "references; escaped(label, [(address, nbytes, view, holders)], outs, ins) is told "
      "the views that were given their own copies.");

  m.def(
      "move_view",
      [](nb::handle obj, uintptr_t old_start, int64_t nbytes, uintptr_t new_start) {
        if (!PyArray_Check(obj.ptr())) throw nb::type_error("not a NumPy array");
        auto *fields = reinterpret_cast<PyArrayObject_fields *>(obj.ptr());
        auto at = reinterpret_cast<uintptr_t>(fields->data);
        if (at < old_start || at >= old_start + static_cast<uintptr_t>(nbytes)) return false;
        fields->data = reinterpret_cast<char *>(new_start + (at - old_start));
        PyArray_CLEARFLAGS(reinterpret_cast<PyArrayObject *>(obj.ptr()), NPY_ARRAY_WRITEABLE);
        return true;
      },
      nb::arg("array"), nb::arg("old_start"), nb::arg("nbytes"), nb::arg("new_start"),
      "Point an array derived from a view (a slice, a reshape) that pointed into "
      "[old_start, old_start + nbytes) at the same place in the view's copy, read-only.");

  m.def(
      "shutdown",
      [](double timeout_s) {
        shutting_down.store(true);
        // Let handlers already running finish their Python work while the interpreter
        // still runs: stopped later, their threads would unwind through XLA and abort.
        nb::gil_scoped_release release;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        while (in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // ... and give their threads a moment to get back from XLA into Python: a thread
        // stopped inside JAX's own dispatch aborts too (jaxlib's frames, not ours).
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      },
      nb::arg("timeout_s") = 10.0,
      "Called at interpreter exit: from then on handlers return an error instead of "
      "calling Python; waits (up to timeout_s) for the handlers already running.");

  m.def(
      "kernel_site_count",
      []() {
        std::lock_guard lock(kernel_mu);
        return kernel_sites.size();
      },
      "Number of kernel sites that calls reach without the GIL.");
  m.def("kernel_abi_version", []() { return JAXBIND_KERNEL_ABI_VERSION; });

  m.def(
      "site_count", []() { return state == nullptr ? size_t(0) : state->sites.size(); },
      "Number of resolved call sites held by the trampoline.");
}
