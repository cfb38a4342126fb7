// jaxbind's trampoline: the XLA FFI handlers, and the module.
//
// Files, from the bottom up:
//   callformat.h  the attributes a call carries; its header (format, site digest)
//   floats.h      IEEE floating point (no flushed subnormals) while a body runs
//   workers.h     XLA's intra-op thread pool, as kernels and the batch loop use it
//   call.h        one described call: its buffers (decoded once), signature, batch loop
//   state.h       an op's state as kernels take it: its policy and objects' addresses
//   kernels.h     compiled kernels' keyword arguments, and the ABI call of a kernel
//   cuda_kernels.h  CUDA kernels: the driver loaded at run time, launches on XLA's stream
//   outputs.h     the opt-in check that a body wrote every element of its outputs
//   process.h     what the handlers share in the process: the Python functions called,
//                 the dtype table
//   site.h        call sites by digest, and what a first call asks of Python
//   views.h       NumPy views of host buffers, for Python callables
//   gpu.h         a site's GPU plan: made in Python once, pointed at each call's buffers
//   this file     the CPU and CUDA handlers, and the module
//
// A program does not name its body by address. A call's attributes (call format 3, see
// jaxbind/_callformat.py) carry the binding's stable name, the role, the encoded keyword
// arguments, jaxbind's batch loop and a 64-bit digest of them all. The digest keys the
// sites; a site's first call, and each new buffer signature, are checked in Python
// against the binding's abstract function (site.h). Then every call, on every platform,
// is the same: its buffers decoded once, jaxbind's loop checked once against them, and
// the body run once per batch element:
//   - a compiled kernel: without the GIL, and without Python once its signature is known;
//   - a Python callable on the CPU: the GIL taken, every input wrapped as a read-only NumPy
//     array and every output as a writable one (zero-copy), and
//         callable(out: tuple, args: tuple, kwargs_dump)
//     called;
//   - on CUDA: the site's GPU plan (jaxbind/_runtime/gpu.py), made in Python once per
//     stream, device and signature, its CudaArray views pointed at the element's device
//     buffers and the plan called (gpu.h); no CUDA header or library is needed here;
//   - a CUDA kernel: launched on XLA's stream from C++ (cuda_kernels.h), through its own
//     target, which XLA may capture into command buffers.
// Unknown names, bad programs and Python exceptions become ffi::Error values, never
// crashes.

#include "call.h"
#include "floats.h"
#include "gpu.h"
#include "kernels.h"
#include "outputs.h"
#include "process.h"
#include "site.h"
#include "site_life.h"
#include "state.h"
#include "views.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#if defined(__GLIBCXX__)
#include <cxxabi.h>  // abi::__forced_unwind
#endif

namespace jaxbind {

// What one call works on, reused by the calls of a thread (no allocation per call once
// warm): the call's buffers, and a batch element's. A stack, because a Python callable
// may call a jaxbind op eagerly, which runs on the same thread.
struct Frame {
  Call call, element;
};

class ScopedFrame {
 public:
  ScopedFrame() {
    Stack &stack = local();
    if (stack.depth == stack.frames.size()) stack.frames.push_back(std::make_unique<Frame>());
    frame_ = stack.frames[stack.depth++].get();
  }
  ~ScopedFrame() { --local().depth; }
  ScopedFrame(const ScopedFrame &) = delete;
  ScopedFrame &operator=(const ScopedFrame &) = delete;
  Frame &operator*() const { return *frame_; }
  Frame *operator->() const { return frame_; }

 private:
  struct Stack {
    std::vector<std::unique_ptr<Frame>> frames;
    size_t depth = 0;
  };
  static Stack &local() {
    thread_local Stack stack;
    return stack;
  }
  Frame *frame_;
};

// Run a kernel site's call: once, or once per batch element (on several of XLA's threads
// when that pays), without the GIL.
inline void run_kernel(const SiteCore &core, jaxbind_kernel_fn fn, Frame &frame,
                       ExecutionContext context) {
  const Loop *batch = core.whole_batch ? &core.loop : nullptr;
  Workers workers(context, core.kernel.threads);
  const bool checking = check_outputs.load(std::memory_order_relaxed);
  if (checking) Unwritten::fill(frame.call);
  core.loop.run(frame.call, core.whole_batch, frame.element, workers,
                [&](const Call &call, const Workers &w) {
                  call_kernel(fn, core.kernel, core.label, call, batch, w);
                });
  if (checking) Unwritten::check(frame.call, core.label);
}

// What each thread keeps between kernel calls: the last signature it matched, and its
// kernel's address (one thread-local lookup per call).
struct FastCache {
  uint64_t matched_id = 0;  // SiteCore::id of the signature below
  Signature signature;
  jaxbind_kernel_fn fn = nullptr;
};

inline FastCache &fast_cache() {
  thread_local FastCache cache;
  return cache;
}

// A kernel call whose site and signature are known: no GIL, no Python object. Returns
// false when the call needs the GIL path (see `guarded`).
bool run_kernel_fast(const RawAttrs &attrs, Instance *held, const ffi::RemainingArgs &args,
                     const ffi::RemainingRets &rets, ExecutionContext context, Frame &frame,
                     ffi::Error &result) {
  FastCache &cache = fast_cache();
  SiteCore *found = find_core(attrs, held);
  if (found == nullptr || !found->is_kernel) return false;
  SiteCore &core = *found;
  try {
    frame.call.decode(args, rets);
  } catch (std::exception &) {
    return false;  // the GIL path reports it, with the binding's name
  }
  jaxbind_kernel_fn fn = nullptr;
  if (cache.matched_id == core.id && cache.signature.matches(frame.call)) {
    fn = cache.fn;
  } else {
    if (!core.accepted.find(frame.call, fn)) return false;
    cache.matched_id = core.id;
    cache.signature = Signature::of(frame.call);
    cache.fn = fn;
  }
  try {
    run_kernel(core, fn, frame, context);
    result = ffi::Error::Success();
  } catch (LabelledError &e) {
    result = error(ffi::ErrorCode::kInternal, e.what());
  } catch (std::invalid_argument &e) {
    result = error(ffi::ErrorCode::kInvalidArgument, core.label + ": " + e.what());
  } catch (std::exception &e) {
    result = error(ffi::ErrorCode::kInternal, core.label + ": " + e.what());
  }
  return true;
}

// A call the definition check (or the resolver) refused: a program error, said plainly,
// naming the binding (a message that names it already is not prefixed with it again).
inline ffi::Error refused(const std::string &binding, const std::string &why) {
  std::string named = "jaxbind: '" + binding + "'";
  if (why.compare(0, named.size(), named) == 0)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, why);
  return error(ffi::ErrorCode::kInvalidArgument, "'" + binding + "': " + why);
}

// What every call that needs Python does around its platform's body: check the call
// format, take the GIL, decode the buffers, resolve the site (accepting the buffers'
// signature), and turn every failure into an ffi::Error that names the binding.
// `body(site, kernel address)` runs the call.
template <typename Body>
ffi::Error guarded(const ffi::Dictionary &attrs, Instance *held, const char *platform,
                   const ffi::RemainingArgs &args, const ffi::RemainingRets &rets, Frame &frame,
                   Body &&body) {
  Header header;
  Header::Problem problem = header.read(attrs);
  if (!problem.message.empty()) return error(problem.code, problem.message);
  InFlight running;  // counted before the check below: see `shutdown`
  if (process == nullptr || python_is_finalizing())
    return error(ffi::ErrorCode::kUnavailable, "the Python interpreter is not running");

  nb::gil_scoped_acquire gil;
  nb::object site;
  // For messages: the binding's name, from the site or (before one is found) the attributes.
  auto name = [&]() -> std::string {
    if (site.is_valid()) return site_of(site).binding;
    std::string_view binding = "?";
    get_attr(attrs, "binding", binding);
    return std::string(binding);
  };
  try {
    frame.call.decode(args, rets);
    jaxbind_kernel_fn fn = nullptr;
    site = find_site(header, attrs, frame.call, fn, held, platform);
    body(site_of(site), fn);
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
    if (!site.is_valid()) {  // the resolver refused the call: a program error, said plainly
      std::string why = e.what();
      try {
        why = nb::cast<std::string>(nb::str(e.value()));
      } catch (...) {
      }
      return refused(name(), why);
    }
    std::string message;
    try {
      nb::object where =
          site.is_valid() ? site_of(site).label : nb::object(nb::str(name().c_str()));
      message =
          nb::cast<std::string>(process->formatter(where, e.type(), e.value(), e.traceback()));
#if defined(__GLIBCXX__)
    } catch (abi::__forced_unwind &) {
      throw;
#endif
    } catch (...) {
      message = "jaxbind: callable of '" + name() + "' failed: " + e.what();
    }
    return ffi::Error(ffi::ErrorCode::kInternal, message);
  } catch (LabelledError &e) {
    return error(ffi::ErrorCode::kInternal, e.what());
  } catch (std::invalid_argument &e) {
    return refused(name(), e.what());
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

// A Python callable on one (batch element of a) CPU call: NumPy views of the buffers,
// the callable called with them, the views released (or kept for the next call).
void run_callable(Site &site, const Call &call) {
  nb::object outs = views(site.out_views, call.outs, true, "output");
  nb::object ins = views(site.in_views, call.ins, false, "input");
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

// CPU: a kernel (without the GIL, and without Python once its site and signature are
// known), or NumPy views of the host buffers and the callable called in place.
ffi::Error CpuCall(ExecutionContext context, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   RawAttrs raw) {
  IeeeFloats ieee;  // subnormals as the body sees them in Python (see floats.h)
  ScopedFrame frame;
  ffi::Error result = ffi::Error::Success();
  Instance *held = instance_of(context);
  if (run_kernel_fast(raw, held, args, rets, context, *frame, result)) return result;
  return guarded(raw.dict(), held, "cpu", args, rets, *frame,
                 [&](Site &site, jaxbind_kernel_fn fn) {
                   SiteCore &core = *site.core.get();
                   if (core.is_kernel) {
                     nb::gil_scoped_release release;
                     return run_kernel(core, fn, *frame, context);
                   }
                   const bool checking = check_outputs.load(std::memory_order_relaxed);
                   if (checking) Unwritten::fill(frame->call);
                   core.loop.run(frame->call, false, frame->element,
                                 [&](const Call &call) { run_callable(site, call); });
                   if (checking) Unwritten::check(frame->call, core.label);
                 });
}

// A CUDA kernel site's call: one launch per batch element, on XLA's stream. No GIL.
void launch_cuda(const SiteCore &core, const Launch &launch, Frame &frame, void *stream,
                 int32_t device) {
  try {
    core.loop.run(frame.call, false, frame.element, [&](const Call &call) {
      core.cuda->launch(launch, call, stream, device, core.label);
    });
  } catch (std::invalid_argument &) {
    throw;  // (the loop's bounds check: a bad program)
  } catch (std::runtime_error &e) {
    throw LabelledError(e.what());  // (its message names the binding and the role)
  }
}

// A GPU call: a CUDA kernel launched, or the site's GPU plan (gpu.h) run once per batch
// element, on the element's device pointers. Also reached from Python, on host memory,
// by the plumbing tests (`gpu_call_for_tests`).
void run_gpu(Site &site, Frame &frame, uintptr_t stream, int32_t device) {
  if (site.core->cuda) {
    const Launch *launch = site.core->cuda->find(frame.call);
    if (launch == nullptr) throw std::runtime_error("no launch for the call's signature");
    nb::gil_scoped_release release;
    return launch_cuda(*site.core.get(), *launch, frame, reinterpret_cast<void *>(stream), device);
  }
  if (!process->gpu_plan.is_valid()) throw std::runtime_error("no GPU plan maker is set");
  if (site.core->is_kernel)
    throw std::invalid_argument(
        "its body is a CPU kernel, which cannot run in a GPU program; run the program on "
        "the CPU, or give the role a CUDA kernel (jaxbind.cuda_kernel) or a Python callable");
  site.core->loop.run(frame.call, false, frame.element,
                      [&](const Call &call) { run_plan(site, stream, device, call); });
}

// CUDA: the device buffers and XLA's stream go to the site's GPU plan, which hands them
// to the callable as zero-copy CUDA arrays, or copies them to the host for a binding in
// host mode. No CUDA header or library is needed here: the stream is an opaque pointer.
ffi::Error CudaCall(ExecutionContext context, void *stream, int32_t device, ffi::RemainingArgs args,
                    ffi::RemainingRets rets, ffi::Dictionary attrs) {
  IeeeFloats ieee;  // a host-mode callable's floats (see floats.h)
  ScopedFrame frame;
  return guarded(attrs, instance_of(context), "cuda", args, rets, *frame,
                 [&](Site &site, jaxbind_kernel_fn) {
                   run_gpu(site, *frame, reinterpret_cast<uintptr_t>(stream), device);
                 });
}

// CUDA, a call of a CUDA kernel (jaxbind.cuda_kernel; the lowering gives such calls this
// handler's target): launched from C++ on XLA's stream, without the GIL or Python once
// the site and signature are known. It keeps no state in XLA and does nothing a CUDA
// graph cannot replay, so it is declared compatible with XLA's command buffers.
ffi::Error CudaKernelCall(void *stream, int32_t device, ffi::RemainingArgs args,
                          ffi::RemainingRets rets, RawAttrs raw) {
  ScopedFrame frame;
  SiteCore *core = find_core(raw, nullptr);  // (no instantiate stage: the digest route)
  const Launch *launch = nullptr;
  if (core != nullptr && core->cuda) {
    try {
      frame->call.decode(args, rets);
      launch = core->cuda->find(frame->call);
    } catch (std::exception &) {
      launch = nullptr;  // the GIL path reports it, with the binding's name
    }
  }
  if (launch != nullptr) {
    try {
      launch_cuda(*core, *launch, *frame, stream, device);
      return ffi::Error::Success();
    } catch (LabelledError &e) {
      return error(ffi::ErrorCode::kInternal, e.what());
    } catch (std::invalid_argument &e) {
      return error(ffi::ErrorCode::kInvalidArgument, core->label + ": " + e.what());
    } catch (std::exception &e) {
      return error(ffi::ErrorCode::kInternal, core->label + ": " + e.what());
    }
  }
  return guarded(raw.dict(), nullptr, "cuda", args, rets, *frame,
                 [&](Site &site, jaxbind_kernel_fn) {
                   run_gpu(site, *frame, reinterpret_cast<uintptr_t>(stream), device);
                 });
}

// XLA's instantiate stage of a call site (every platform): the site made from the call's
// attributes and kept by XLA with the executable (see `instantiate` in site.h). A site
// the resolver refuses, or whose state's setup fails, fails the compilation (or the
// loading) of the program, with the error a call would give.
// `platform` ("cpu" or "cuda") tells the resolver whether to set the state up now: on a
// GPU, XLA gives no stream or device here, so each device's is set up at its first call.
ffi::Error Instantiate(ExecutionContext context, const ffi::Dictionary &attrs,
                       const char *platform) {
  Header header;
  Header::Problem problem = header.read(attrs);
  if (!problem.message.empty()) return error(problem.code, problem.message);
  InFlight running;
  if (!python_is_usable() || !process->instantiate.is_valid()) return ffi::Error::Success();
  // jaxlib 0.7's FFI (API 0.1) keeps no state here: its sites are found by digest (an
  // executable freed there aborted the process in the CI run with the 0.1 layout)
  if (!xla_state::keeps_state(context.api)) return ffi::Error::Success();
  IeeeFloats ieee;  // the state's setup is Python, as a body (see floats.h)
  nb::gil_scoped_acquire gil;
  std::string_view binding = "?";
  get_attr(attrs, "binding", binding);
  try {
    instantiate(context, header, attrs, platform);
    return ffi::Error::Success();
  } catch (nb::python_error &e) {
    std::string why = e.what();
    try {
      why = nb::cast<std::string>(nb::str(e.value()));
    } catch (...) {
    }
    return refused(std::string(binding), why);
#if defined(__GLIBCXX__)
  } catch (abi::__forced_unwind &) {
    throw;
#endif
  } catch (std::exception &e) {
    return error(ffi::ErrorCode::kInternal, "'" + std::string(binding) + "': " + e.what());
  } catch (...) {
    return error(ffi::ErrorCode::kInternal,
                 "'" + std::string(binding) + "': unknown C++ exception");
  }
}

// The buffers are not used here. XLA's CPU runtime gives none at this stage; its GPU
// runtime (jaxlib 0.11) gives the call's, and a binding without them refuses every call
// ("Wrong number of arguments: expected 0").
ffi::Error InstantiateCpu(ExecutionContext context, ffi::RemainingArgs, ffi::RemainingRets,
                          ffi::Dictionary attrs) {
  return Instantiate(context, attrs, "cpu");
}

ffi::Error InstantiateCuda(ExecutionContext context, ffi::RemainingArgs, ffi::RemainingRets,
                           ffi::Dictionary attrs) {
  return Instantiate(context, attrs, "cuda");
}

// The garbage collector's view of a Site: everything it holds that can lead
// back to user objects (nanobind's recipe for cyclic garbage collection).
int site_traverse(PyObject *self, visitproc visit, void *arg) {
#if PY_VERSION_HEX >= 0x03090000
  Py_VISIT(Py_TYPE(self));
#endif
  if (!nb::inst_ready(self)) return 0;
  Site &s = site_of(self);
  for (const nb::object *held :
       {&s.resolved, &s.callable, &s.kwargs_dump, &s.label, &s.accept, &s.gpu.plan, &s.gpu.views})
    Py_VISIT(held->ptr());
  return 0;
}

int site_clear(PyObject *self) {
  Site &s = site_of(self);
  for (nb::object *held : {&s.resolved, &s.callable, &s.kwargs_dump, &s.accept}) held->reset();
  s.out_views.reset();
  s.in_views.reset();
  s.gpu = GpuPlan();
  return 0;
}

}  // namespace jaxbind

using namespace jaxbind;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cpu_instantiate, InstantiateCpu,
                              ffi::Ffi::BindInstantiate()
                                  .Ctx<ExecutionContext>()     // where XLA keeps the site
                                  .RemainingArgs()             // given on GPU, not used
                                  .RemainingRets()             // given on GPU, not used
                                  .Attrs<ffi::Dictionary>());  // the call's attributes

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cuda_instantiate, InstantiateCuda,
                              ffi::Ffi::BindInstantiate()
                                  .Ctx<ExecutionContext>()     // where XLA keeps the site
                                  .RemainingArgs()             // given on GPU, not used
                                  .RemainingRets()             // given on GPU, not used
                                  .Attrs<ffi::Dictionary>());  // the call's attributes

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxbind_cpu_handler, CpuCall,
    ffi::Ffi::Bind()
        .Ctx<ExecutionContext>()  // the site XLA keeps, if any; XLA's intra-op pool
        .RemainingArgs()          // inputs, any dtype and rank
        .RemainingRets()          // outputs, written in place
        .Attrs<RawAttrs>());      // jaxbind_format, site, binding, role, kwargs, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cuda_handler, CudaCall,
                              ffi::Ffi::Bind()
                                  .Ctx<ExecutionContext>()             // the site XLA keeps
                                  .Ctx<ffi::PlatformStream<void *>>()  // XLA's CUDA stream
                                  .Ctx<ffi::DeviceOrdinal>()           // the device's ordinal
                                  .RemainingArgs()                     // inputs, device memory
                                  .RemainingRets()  // outputs, device memory, written in place
                                  .Attrs<ffi::Dictionary>());  // as on the CPU

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cuda_kernel_handler, CudaKernelCall,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()  // XLA's CUDA stream
                                  .Ctx<ffi::DeviceOrdinal>()           // the device's ordinal
                                  .RemainingArgs()                     // inputs, device memory
                                  .RemainingRets()     // outputs, device memory, written in place
                                  .Attrs<RawAttrs>(),  // as on the CPU
                              {ffi::Traits::kCmdBufferCompatible});

NB_MODULE(_ext, m) {
  if (_import_array() < 0) throw nb::python_error();
  // Sites of bindings that live until exit (module-level ops) are still alive when
  // the interpreter shuts down, on purpose (see Process): not leaks worth reporting.
  nb::set_leak_warnings(false);

  m.attr("call_format") = kCallFormat;
  m.attr("jaxlib_version") = JAXBIND_JAXLIB_VERSION;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);

  xla_state::deleter = free_instance;
  auto bundle = [](void *instantiate, void *execute) {
    nb::dict handlers;
    handlers["instantiate"] = nb::capsule(instantiate);
    handlers["execute"] = nb::capsule(execute);
    return handlers;
  };
  m.def(
      "cpu_handlers",
      [=]() {
        return bundle(reinterpret_cast<void *>(jaxbind_cpu_instantiate),
                      reinterpret_cast<void *>(jaxbind_cpu_handler));
      },
      "The CPU FFI handlers, {stage: PyCapsule}, for jax.ffi.register_ffi_target.");
  m.def(
      "cuda_handlers",
      [=]() {
        return bundle(reinterpret_cast<void *>(jaxbind_cuda_instantiate),
                      reinterpret_cast<void *>(jaxbind_cuda_handler));
      },
      "The CUDA FFI handlers, {stage: PyCapsule} (built without the CUDA toolkit).");
  m.def(
      "cuda_kernel_launches", []() { return cuda_launches.load(); },
      "How many CUDA kernel launches jaxbind's handlers made in this process (a program "
      "XLA replays from a CUDA graph makes none).");
  m.def(
      "cuda_kernel_handlers",
      []() {
        nb::dict handlers;
        handlers["execute"] = nb::capsule(reinterpret_cast<void *>(jaxbind_cuda_kernel_handler));
        return handlers;
      },
      "The FFI handler of calls of CUDA kernels, {stage: PyCapsule}: execute only (no "
      "state kept in XLA), compatible with command buffers.");
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
          "__init__", [](Site *self, nb::handle resolved) { new (self) Site(resolved); },
          nb::arg("resolved"),
          "From the resolver's description of the site (jaxbind._runtime.resolve.Resolved).")
      .def_prop_ro("binding", [](const Site &s) { return s.binding; })
      .def_prop_ro("levels", [](const Site &s) { return s.core->loop.levels; })
      .def_prop_ro("known_signatures",
                   [](const Site &s) {
                     return s.core->cuda ? s.core->cuda->known() : s.core->accepted.size();
                   })
      .def_prop_ro("is_kernel", [](const Site &s) { return s.core->is_kernel; })
      .def(
          "retire", [](Site &s) { s.core->alive.store(false, std::memory_order_release); },
          "Stop calls from using this site (its binding was defined again): the executables "
          "that hold it instantiate their site again at their next call.")
      .def_prop_ro(
          "routes",
          [](const Site &s) {
            uint8_t r = s.core->routes.load(std::memory_order_relaxed);
            nb::list found;
            if (r & kBySlot) found.append("slot");
            if (r & kByDigest) found.append("digest");
            return found;
          },
          "How calls found this site: 'slot' (XLA's per-site slot), 'digest' (the digest "
          "route, where XLA keeps none).");

  nb::exception<ReentrantUse>(m, "ReentrantUse", PyExc_RuntimeError);

  nb::class_<CellHandle>(m, "StateCell",
                         "The concurrency of one state's objects, as kernels and Python bodies "
                         "take them (see cpp/state.h; made by jaxbind._runtime.state.Shared).")
      .def(
          "__init__",
          [](CellHandle *self, int policy, int size, nb::handle owner, std::string label,
             std::string state) {
            new (self) CellHandle{
                CellRef(new StateCell(policy, size, owner, std::move(label), std::move(state)))};
          },
          nb::arg("policy"), nb::arg("size"), nb::arg("owner"), nb::arg("label"),
          nb::arg("state") = "",
          "policy: 0 lock, 1 pool, 2 shared; size: a pool's objects at most; owner: the "
          "state, whose provide(slot, make) gives a slot's address (held weakly); label and "
          "state (the setup's name) for messages.")
      .def(
          "acquire",
          [](CellHandle &h) {
            auto [slot, made_here] = h.cell->acquire();
            return made_here ? -1 - slot : slot;
          },
          "The slot of an object for one call, taken under the policy (waits without the "
          "GIL, never for an object this thread holds: RuntimeError then); -1 - slot for a "
          "slot whose object the caller makes (or abandons).")
      .def(
          "release", [](CellHandle &h, int slot) { h.cell->release(slot); }, nb::arg("slot"))
      .def(
          "abandon", [](CellHandle &h, int slot) { h.cell->abandon(slot); }, nb::arg("slot"))
      .def(
          "set_address",
          [](CellHandle &h, int slot, uintptr_t address) { h.cell->set_address(slot, address); },
          nb::arg("slot"), nb::arg("address"))
      .def(
          "close", [](CellHandle &h) { h.cell->close(); },
          "Wait for the calls using an object, and refuse later ones: then the objects may "
          "be torn down.")
      .def_prop_ro("closed", [](CellHandle &h) { return h.cell->closed(); });

  m.def(
      "gpu_call_for_tests",
      [](Site &site, uintptr_t stream, int32_t device, nb::handle ins, nb::handle outs) {
        // the buffers as the GPU plan maker gets them: (address, shape, XLA element type)
        std::vector<std::vector<int64_t>> dims;  // (moving an inner vector keeps its data)
        auto read = [&](nb::handle items, std::vector<Buffer> &out) {
          for (nb::handle item : items) {
            nb::tuple t = nb::cast<nb::tuple>(item);
            dims.push_back(nb::cast<std::vector<int64_t>>(t[1]));
            out.push_back(Buffer{reinterpret_cast<void *>(nb::cast<uintptr_t>(t[0])),
                                 nb::cast<int64_t>(t[2]), static_cast<int64_t>(dims.back().size()),
                                 dims.back().data()});
          }
        };
        Frame frame;
        read(ins, frame.call.ins);
        read(outs, frame.call.outs);
        try {
          run_gpu(site, frame, stream, device);
        } catch (std::invalid_argument &e) {
          throw nb::value_error(e.what());
        }
      },
      nb::arg("site"), nb::arg("stream"), nb::arg("device"), nb::arg("inputs"), nb::arg("outputs"),
      "Run the CUDA handler's body for `site` on buffers given as (address, shape, XLA "
      "element type): its batch loop and the site's GPU plan, without a GPU (host memory "
      "stands in for device memory), for tests.");

  m.def(
      "set_gpu_plan",
      [](nb::object make) {
        if (process == nullptr) process = new Process();
        process->gpu_plan = make;
      },
      nb::arg("make"),
      "Set the Python function that makes a site's GPU plan: (resolved, stream, device, "
      "inputs, outputs), each buffer as (address, shape, element type) -> a plan with "
      "`views` (each with a settable `ptr`) that runs the call when called.");

  m.def(
      "init",
      [](nb::dict dtypes, nb::object resolver, nb::object instantiate, nb::object formatter,
         nb::object gpu_plan) {
        if (process == nullptr) process = new Process();
        for (auto [key, value] : dtypes) {
          auto code = nb::cast<size_t>(key);
          if (code >= kNumDtypes) throw nb::value_error("XLA element type out of range");
          PyArray_Descr *descr = nullptr;
          if (!PyArray_DescrConverter(value.ptr(), &descr)) throw nb::python_error();
          Py_XDECREF(reinterpret_cast<PyObject *>(process->dtypes[code]));
          process->dtypes[code] = descr;
        }
        process->resolver = resolver;
        process->instantiate = instantiate;
        process->formatter = formatter;
        process->gpu_plan = gpu_plan;
      },
      nb::arg("dtypes"), nb::arg("resolver"), nb::arg("instantiate"), nb::arg("formatter"),
      nb::arg("gpu_plan"),
      "Set the dtype table {XLA element type: numpy dtype}, the site resolver, the "
      "instantiate stage's site maker, the error formatter and the GPU plan maker (see "
      "jaxbind/_runtime/__init__.py).");

  m.def(
      "set_view_hooks",
      [](nb::object collect_garbage, nb::object escaped) {
        if (process == nullptr) process = new Process();
        process->collect_garbage = collect_garbage;
        process->escaped = escaped;
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
        std::lock_guard lock(fast_mu);
        return fast_sites.size();
      },
      "Number of kernel sites that calls reach without the GIL.");
  m.def("kernel_abi_version", []() { return JAXBIND_KERNEL_ABI_VERSION; });
  m.def(
      "set_check_outputs", [](bool on) { return check_outputs.exchange(on); }, nb::arg("on"),
      "Check that bodies of CPU calls write every element of their outputs (see "
      "cpp/outputs.h), or stop; returns the setting before.");
  m.def(
      "parallel_for_address", []() { return reinterpret_cast<uintptr_t>(&parallel_for); },
      "The address of the kernel ABI's parallel_for, for kernels called from Python "
      "(jaxbind/_kernels/abi.py): with no workers, it runs the tasks in order.");

  m.def(
      "site_count", []() { return Site::alive.load(std::memory_order_relaxed); },
      "Number of resolved call sites alive (owned by programs, executables or the digest "
      "table).");
}
