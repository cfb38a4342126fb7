// jaxbind's trampoline: the XLA FFI handlers. Each begins with one lookup, the call's
// Instance (site_life.h, find_instance), and runs its platform's body over the one
// described call (call.h) inside the one error boundary (boundary.h):
//   CpuHandler         a compiled kernel without the GIL (`run_kernel_fast`, kernel_path.h,
//                      which the C runtime's handler runs too), else the GIL
//                      taken (`guarded`): a kernel, or a Python callable on NumPy views
//   CudaHandler        a kernel for CUDA (jaxbind.kernel(platform="cuda")) called with XLA's
//                      stream without the GIL, else the site's GPU plan (gpu.h), or a CUDA
//                      kernel reached by the GIL path
//   CudaKernelHandler  a CUDA kernel launched, or a graph-safe kernel for CUDA called, on
//                      XLA's stream without the GIL, else `guarded`
//   InstantiateCpu/Cuda  XLA's instantiate stage (every platform): the site kept by XLA
// and their bindings to XLA's FFI (the XLA_FFI_DEFINE_HANDLER_SYMBOL blocks at the end).
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "boundary.h"
#include "call.h"
#include "floats.h"
#include "gpu.h"
#include "kernel_path.h"
#include "kernels.h"
#include "outputs.h"
#include "process.h"
#include "site.h"
#include "site_life.h"
#include "state.h"
#include "views.h"

namespace jaxbind {

// What every call that needs Python does around its platform's body: take Python
// (PythonScope), decode the buffers and take the instance's site (accepting the buffers'
// signature), inside the boundary, which names the binding (and, once the site is known,
// its role). `body(site, kernel address)` runs the call.
//
// Calls that came this way, in this process (jaxbind._ext.python_entries): a compiled
// body's call after its site's first comes without Python, so a count that grows with
// such calls says that something sent them here.
inline std::atomic<int64_t> python_entries{0};

template <typename Body>
ffi::Error guarded(const ffi::Dictionary &attrs, Instance &instance, const char *platform,
                   const ffi::RemainingArgs &args, const ffi::RemainingRets &rets, Frame &frame,
                   Body &&body) {
  python_entries.fetch_add(1, std::memory_order_relaxed);
  Where where = Where::of_attrs(attrs);
  PythonScope python;  // (outlives the boundary: a failure is read with the GIL)
  nb::object site;     // (so does the site: a failure names it by its label)
  return boundary(where, [&] {
    python.require();
    frame.call.decode(args, rets);
    jaxbind_kernel_fn fn = nullptr;
    site = site_of_call(instance, attrs, frame.call, fn, platform);
    Site &found = site_of(site);
    where.binding = found.binding;
    where.label = &found.core->label;
    body(found, fn);
  });
}

// A Python callable on one (batch element of a) CPU call: NumPy views of the buffers,
// the callable called with them, the views released (or kept for the next call).
inline void run_callable(Site &site, const Call &call) {
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
                  "results instead, define the op with the pytree API "
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
inline ffi::Error CpuHandler(ExecutionContext context, ffi::RemainingArgs args,
                             ffi::RemainingRets rets, RawAttrs raw) {
  IeeeFloats ieee;  // subnormals as the body sees them in Python (see floats.h)
  ScopedFrame frame;
  Instance *instance = nullptr;
  ffi::Error result = find_instance(context, raw, "cpu", frame->kept, instance);
  if (result.failure()) return result;
  if (run_kernel_fast(*instance, args, rets, context, *frame, result)) return result;
  return guarded(raw.dict(), *instance, "cpu", args, rets, *frame,
                 [&](Site &site, jaxbind_kernel_fn fn) {
                   SiteCore &core = *site.core.get();
                   if (core.is_kernel && core.kernel.on_cuda)
                     throw std::invalid_argument(
                         "its body is a kernel for CUDA (jaxbind.kernel(..., "
                         "platform=\"cuda\")), which cannot run in a CPU program; run the "
                         "program on a CUDA device, or give the op a reference for the CPU");
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
inline void launch_cuda(const SiteCore &core, const Launch &launch, Frame &frame, void *stream,
                        int32_t device) {
  core.loop.run(frame.call, false, frame.element, [&](const Call &call) {
    core.cuda->launch(launch, call, stream, device, core.label);
  });
}

// A GPU call: a CUDA kernel launched, or the site's GPU plan (gpu.h) run once per batch
// element, on the element's device pointers. Also reached from Python, on host memory,
// by the plumbing tests (`gpu_call_for_tests`).
inline void run_gpu(Site &site, Frame &frame, uintptr_t stream, int32_t device,
                    jaxbind_kernel_fn fn) {
  if (site.core->is_kernel && site.core->kernel.on_cuda) {
    nb::gil_scoped_release release;
    return run_stream_kernel(*site.core.get(), fn, frame,
                             Place::cuda(reinterpret_cast<void *>(stream), device));
  }
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
        "the CPU, or give the role a kernel for CUDA (jaxbind.kernel(..., platform=\"cuda\"), "
        "jaxbind.cuda_kernel) or a Python callable");
  site.core->loop.run(frame.call, false, frame.element,
                      [&](const Call &call) { run_plan(site, stream, device, call); });
}

// CUDA: the device buffers and XLA's stream go to the site's GPU plan, which hands them
// to the callable as zero-copy CUDA arrays, or copies them to the host for a binding in
// host mode. No CUDA header or library is needed here: the stream is an opaque pointer.
inline ffi::Error CudaHandler(ExecutionContext context, void *stream, int32_t device,
                              ffi::RemainingArgs args, ffi::RemainingRets rets, RawAttrs raw) {
  IeeeFloats ieee;  // a host-mode callable's floats (see floats.h)
  ScopedFrame frame;
  Instance *instance = nullptr;
  ffi::Error found = find_instance(context, raw, "cuda", frame->kept, instance);
  if (found.failure()) return found;
  if (run_stream_kernel_fast(*instance, args, rets, *frame, Place::cuda(stream, device), found))
    return found;
  return guarded(raw.dict(), *instance, "cuda", args, rets, *frame,
                 [&](Site &site, jaxbind_kernel_fn fn) {
                   run_gpu(site, *frame, reinterpret_cast<uintptr_t>(stream), device, fn);
                 });
}

// The CUDA handler's work once its site is found (the signature accepted, the body run)
// inside the boundary, on buffers Python describes (host memory stands in for device
// memory): the error the handler would return, for the plumbing tests.
inline ffi::Error gpu_work_for_tests(Site &site, Frame &frame, uintptr_t stream, int32_t device) {
  PythonScope python;
  Where where = Where::of_label(site.core->label);
  where.binding = site.binding;
  return boundary(where, [&] {
    python.require();
    run_gpu(site, frame, stream, device, accept(site, frame.call));
  });
}

// CUDA, a call of a CUDA kernel (jaxbind.cuda_kernel) or of a graph-safe kernel for CUDA
// (jaxbind.kernel(..., platform="cuda", graph_safe=True); the lowering gives such calls
// this handler's target): launched, or called, from C++ on XLA's stream, without the GIL
// or Python once the site and signature are known. Registered without an instantiate
// stage (XLA keeps no slot for it), it does nothing a CUDA graph cannot replay (a
// graph-safe kernel says so of itself, and takes no state), so it is declared compatible
// with XLA's command buffers.
inline ffi::Error CudaKernelHandler(void *stream, int32_t device, ffi::RemainingArgs args,
                                    ffi::RemainingRets rets, RawAttrs raw) {
  ScopedFrame frame;
  Instance *instance = nullptr;
  ffi::Error found = find_instance(raw, "cuda", frame->kept, instance);
  if (found.failure()) return found;
  if (run_stream_kernel_fast(*instance, args, rets, *frame, Place::cuda(stream, device), found))
    return found;  // a graph-safe CUDA kernel of the ABI
  SiteCore *core = live_core(*instance);
  const Launch *launch = nullptr;
  if (core != nullptr && core->cuda) {
    try {
      frame->call.decode(args, rets);
      launch = core->cuda->find(frame->call);
    } catch (std::exception &) {
      launch = nullptr;  // the GIL path reports it, with the binding's name
    }
  }
  if (launch != nullptr)
    return boundary(Where::of_label(core->label),
                    [&] { launch_cuda(*core, *launch, *frame, stream, device); });
  return guarded(raw.dict(), *instance, "cuda", args, rets, *frame,
                 [&](Site &site, jaxbind_kernel_fn fn) {
                   run_gpu(site, *frame, reinterpret_cast<uintptr_t>(stream), device, fn);
                 });
}

// XLA's instantiate stage of a call site (every platform): the site made from the call's
// attributes and kept by XLA with the executable (site_life.h, instantiate). A site
// Python refuses, or whose op's state fails its setup, fails the compilation (or the
// loading) of the program, with the error a call would give.
// `platform` ("cpu" or "cuda") tells Python whether to set the op's state up now: on a
// GPU, XLA gives no stream or device here, so each device's is set up at its first call.
// The buffers are not used here. XLA's CPU runtime gives none at this stage; its GPU
// runtime (jaxlib 0.11) gives the call's, and a binding without them refuses every call
// ("Wrong number of arguments: expected 0").
inline ffi::Error InstantiateCpu(ExecutionContext context, ffi::RemainingArgs, ffi::RemainingRets,
                                 ffi::Dictionary attrs) {
  return instantiate(context, attrs, "cpu");
}

inline ffi::Error InstantiateCuda(ExecutionContext context, ffi::RemainingArgs, ffi::RemainingRets,
                                  ffi::Dictionary attrs) {
  return instantiate(context, attrs, "cuda");
}

// The handlers as XLA calls them, each with its binding: what XLA decodes for it.

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
    jaxbind_cpu_handler, CpuHandler,
    ffi::Ffi::Bind()
        .Ctx<ExecutionContext>()  // the site XLA keeps, if any; XLA's intra-op pool
        .RemainingArgs()          // inputs, any dtype and rank
        .RemainingRets()          // outputs, written in place
        .Attrs<RawAttrs>());      // jaxbind_format, site, binding, role, kwargs, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cuda_handler, CudaHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ExecutionContext>()             // the site XLA keeps
                                  .Ctx<ffi::PlatformStream<void *>>()  // XLA's CUDA stream
                                  .Ctx<ffi::DeviceOrdinal>()           // the device's ordinal
                                  .RemainingArgs()                     // inputs, device memory
                                  .RemainingRets()      // outputs, device memory, written in place
                                  .Attrs<RawAttrs>());  // as on the CPU

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxbind_cuda_kernel_handler, CudaKernelHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()  // XLA's CUDA stream
                                  .Ctx<ffi::DeviceOrdinal>()           // the device's ordinal
                                  .RemainingArgs()                     // inputs, device memory
                                  .RemainingRets()     // outputs, device memory, written in place
                                  .Attrs<RawAttrs>(),  // as on the CPU
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jaxbind
