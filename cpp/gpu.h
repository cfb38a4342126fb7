// jaxbind's trampoline: GPU calls. A site's GPU plan (jaxbind/_runtime/gpu.py, Plan) is
// made in Python once per stream, device and batch element's signature, and kept on the
// site (Site::gpu); per batch element, each of its views' `ptr` is set to the element's
// device address and the plan is called.
//
// A new plan is made for another stream, device or signature; after a call whose
// callable kept a view (a reference to it, strong or weak, outlives the call), so that
// the kept view is never pointed at later buffers; and, not kept, for a call that finds
// the plan in use (another thread inside the same site's body, which may release the
// GIL, or a nested call), so that no call sees another's addresses.
#pragma once

#include "call.h"
#include "process.h"
#include "site.h"

namespace jaxbind {

// A new plan from Python for the element's buffers.
inline GpuPlan make_plan(const Site &site, uintptr_t stream, int32_t device, const Call &call) {
  GpuPlan made;
  made.plan =
      process->gpu_plan(site.description, stream, device, describe(call.ins), describe(call.outs));
  made.views = made.plan.attr("views");
  auto n = static_cast<Py_ssize_t>(call.ins.size() + call.outs.size());
  if (!PyTuple_Check(made.views.ptr()) || PyTuple_Size(made.views.ptr()) != n)
    throw std::runtime_error("the GPU plan has not one view per buffer");
  made.stream = stream;
  made.device = device;
  made.signature = Signature::of(call);
  return made;
}

// Point a plan's views at the element's buffers.
inline void point(const GpuPlan &p, const Call &call) {
  static PyObject *ptr = PyUnicode_InternFromString("ptr");
  Py_ssize_t i = 0;
  for (const auto *side : {&call.ins, &call.outs})
    for (const Buffer &b : *side) {
      PyObject *address = PyLong_FromSize_t(reinterpret_cast<uintptr_t>(b.data));
      if (address == nullptr) throw nb::python_error();
      int failed = PyObject_SetAttr(PyTuple_GetItem(p.views.ptr(), i++), ptr, address);
      Py_DECREF(address);
      if (failed != 0) throw nb::python_error();
    }
}

inline void count_refs(GpuPlan &p) {
  p.refs.assign(1, Py_REFCNT(p.views.ptr()));
  for (nb::handle view : nb::borrow<nb::tuple>(p.views)) p.refs.push_back(Py_REFCNT(view.ptr()));
}

// Whether the last call's callable kept the views' tuple or a view (held weakly counts).
inline bool kept(const GpuPlan &p) {
  static PyObject *weakrefs = PyUnicode_InternFromString("__weakref__");
  if (Py_REFCNT(p.views.ptr()) != p.refs[0]) return true;
  size_t i = 1;
  for (nb::handle view : nb::borrow<nb::tuple>(p.views)) {
    if (Py_REFCNT(view.ptr()) != p.refs[i++]) return true;
    PyObject *first = PyObject_GetAttr(view.ptr(), weakrefs);  // None, or a weak reference
    if (first == nullptr) throw nb::python_error();
    bool held = first != Py_None;
    Py_DECREF(first);
    if (held) return true;
  }
  return false;
}

inline void call_plan(nb::handle plan) {
  PyObject *result = PyObject_CallNoArgs(plan.ptr());
  if (result == nullptr) throw nb::python_error();
  Py_DECREF(result);
}

// Run one GPU call, or one batch element of it, with the GIL held: the site's plan if it
// fits, else a new one (kept on the site unless the site's plan is in use).
inline void run_plan(Site &site, uintptr_t stream, int32_t device, const Call &call) {
  GpuPlan &cached = site.gpu;
  if (cached.busy) return call_plan(make_plan(site, stream, device, call).plan);
  if (cached.plan.is_valid() && cached.stream == stream && cached.device == device &&
      cached.signature.matches(call)) {
    point(cached, call);
  } else {
    cached = make_plan(site, stream, device, call);
    count_refs(cached);
  }
  nb::object plan = cached.plan;  // held here too: the collector may clear the site meanwhile
  cached.busy = true;
  try {
    call_plan(plan);
  } catch (...) {
    // (a failed call's traceback holds the views: its plan is not reused)
    if (cached.plan.ptr() == plan.ptr()) cached = GpuPlan();
    throw;
  }
  if (cached.plan.ptr() != plan.ptr()) return;  // cleared meanwhile
  cached.busy = false;
  plan.reset();
  if (kept(cached)) cached = GpuPlan();
}

}  // namespace jaxbind
