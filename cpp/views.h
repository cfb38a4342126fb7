// jaxbind's trampoline: NumPy views of XLA's host buffers, for Python callables on the CPU.
#pragma once

#include "call.h"
#include "process.h"
#include "site.h"

namespace jaxbind {

// A new C-contiguous NumPy array over the view's memory (zero-copy).
inline PyObject *wrap(const Buffer &v, bool writeable, const char *what, size_t index) {
  auto code = static_cast<size_t>(v.dtype);
  PyArray_Descr *descr = code < kNumDtypes ? process->dtypes[code] : nullptr;
  if (descr == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s %zu has XLA element type %zu, which jaxbind cannot wrap",
                 what, index, code);
    throw nb::python_error();
  }
  if (v.rank > NPY_MAXDIMS) {
    PyErr_Format(PyExc_ValueError, "%s %zu has rank %lld; NumPy allows at most %d", what, index,
                 static_cast<long long>(v.rank), NPY_MAXDIMS);
    throw nb::python_error();
  }
  npy_intp shape[NPY_MAXDIMS];
  for (int64_t i = 0; i < v.rank; ++i) shape[i] = static_cast<npy_intp>(v.dims[i]);
  Py_INCREF(reinterpret_cast<PyObject *>(descr));  // PyArray_NewFromDescr steals it
  PyObject *array =
      PyArray_NewFromDescr(&PyArray_Type, descr, static_cast<int>(v.rank), shape, nullptr, v.data,
                           writeable ? NPY_ARRAY_CARRAY : NPY_ARRAY_CARRAY_RO, nullptr);
  if (array == nullptr) throw nb::python_error();
  return array;
}

// Whether something holds a weak reference to a view (weakref.ref, a
// WeakValueDictionary, weakref.finalize, a WeakSet): it can reach the view without
// holding a reference count, so the view counts as kept.
inline bool weakly_held(PyObject *obj) {
  return reinterpret_cast<PyArrayObject_fields *>(obj)->weakreflist != nullptr;
}

// Point a view of an earlier call at new memory, if nothing else holds it, strongly or
// weakly, it never got its own copy, and it still has the dtype, shape and strides
// `wrap` would give it.
inline bool repoint(PyObject *obj, const Buffer &v, bool writeable) {
  auto *array = reinterpret_cast<PyArrayObject *>(obj);
  auto code = static_cast<size_t>(v.dtype);
  if (Py_REFCNT(obj) != 1 || weakly_held(obj) || PyArray_BASE(array) != nullptr ||
      code >= kNumDtypes || PyArray_DESCR(array) != process->dtypes[code] ||
      PyArray_NDIM(array) != static_cast<int>(v.rank))
    return false;
  npy_intp stride = PyArray_ITEMSIZE(array);
  for (int d = static_cast<int>(v.rank) - 1; d >= 0; --d) {
    if (PyArray_DIM(array, d) != v.dims[d] || PyArray_STRIDE(array, d) != stride) return false;
    if (v.dims[d] != 0) stride *= v.dims[d];
  }
  reinterpret_cast<PyArrayObject_fields *>(obj)->data = static_cast<char *>(v.data);
  if (writeable)
    PyArray_ENABLEFLAGS(array, NPY_ARRAY_WRITEABLE);
  else
    PyArray_CLEARFLAGS(array, NPY_ARRAY_WRITEABLE);
  return true;
}

// A tuple of views over a call's inputs or outputs. `cache` holds the tuple of the
// site's last call, if any; it is taken (so that a nested or concurrent call of the same
// site builds its own) and reused where it fits.
inline nb::object views(nb::object &cache, const std::vector<Buffer> &buffers, bool writeable,
                        const char *what) {
  nb::object tuple = std::move(cache);
  auto n = static_cast<Py_ssize_t>(buffers.size());
  if (!tuple.is_valid() || Py_REFCNT(tuple.ptr()) != 1 || PyTuple_Size(tuple.ptr()) != n) {
    PyObject *fresh = PyTuple_New(n);
    if (fresh == nullptr) throw nb::python_error();
    tuple = nb::steal(fresh);
  } else if (!PyObject_GC_IsTracked(tuple.ptr())) {
    PyObject_GC_Track(tuple.ptr());  // hidden while cached (see `cache_views`)
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Buffer &v = buffers[static_cast<size_t>(i)];
    // Functions, not the PyTuple_*_ITEM macros: the limited C API has only these.
    // A fresh tuple's items are NULL, and PyTuple_GetItem reads them as such.
    PyObject *old = PyTuple_GetItem(tuple.ptr(), i);
    if (old != nullptr && repoint(old, v, writeable)) continue;
    if (PyTuple_SetItem(tuple.ptr(), i, wrap(v, writeable, what, i)) != 0)  // drops `old`
      throw nb::python_error();
  }
  return tuple;
}

// After the call, the views point at memory XLA will reuse. Make the output
// views read-only, so that nothing can write into later results through them.
inline void make_read_only(const nb::object &outs) {
  for (nb::handle view : nb::borrow<nb::tuple>(outs))
    PyArray_CLEARFLAGS(reinterpret_cast<PyArrayObject *>(view.ptr()), NPY_ARRAY_WRITEABLE);
}

// Whether anything but the call itself still refers to the views or their tuples
// (`weakly`: or holds a weak reference to a view).
inline bool any_kept(const nb::object &outs, const nb::object &ins, bool weakly) {
  if (Py_REFCNT(outs.ptr()) > 1 || Py_REFCNT(ins.ptr()) > 1) return true;
  for (const nb::object *views : {&outs, &ins})
    for (nb::handle view : nb::borrow<nb::tuple>(*views))
      if (Py_REFCNT(view.ptr()) > 1 || (weakly && weakly_held(view.ptr()))) return true;
  return false;
}

// Keep a call's views for the site's next call, out of the garbage collector's sight:
// between calls nothing can reach them (gc.get_objects() and gc.get_referrers() list only
// tracked objects, and NumPy arrays are never tracked), so no one sees the next call's
// data through them. `views` tracks a tuple again when it hands it to a callable.
inline void cache_views(nb::object &cache, nb::object &&tuple) {
  if (PyObject_GC_IsTracked(tuple.ptr())) PyObject_GC_UnTrack(tuple.ptr());
  cache = std::move(tuple);
}

// Give a view that outlives its call its own copy of the data: it keeps reading what
// the buffer held at the end of the call, never memory XLA has reused. The copy becomes
// the view's base (a view of XLA's memory has none), so it lives as long as the view.
inline void detach(PyObject *obj) {
  auto *array = reinterpret_cast<PyArrayObject *>(obj);
  if (PyArray_BASE(array) != nullptr) return;  // already has its own copy
  PyObject *copy = PyArray_NewCopy(array, NPY_CORDER);
  if (copy == nullptr) throw nb::python_error();
  reinterpret_cast<PyArrayObject_fields *>(obj)->data =
      PyArray_BYTES(reinterpret_cast<PyArrayObject *>(copy));
  if (PyArray_SetBaseObject(array, copy) != 0) throw nb::python_error();  // steals `copy`
}

// After the call: returns false when nothing kept a view, strongly or weakly (the site
// reuses them next time). Views held only weakly are not reused: they die with the
// call, and their weak references with them. Otherwise JAX's own lingering references
// (arrays passed to jax calls inside the callable) are dropped first; views still
// referred to then, or all views of a tuple that was kept, get their own copies, and
// `escaped` (see _runtime) is told the memory they pointed at and how many references
// each had, to warn about JAX arrays that alias that memory.
inline bool release_views(const nb::object &outs, const nb::object &ins, const Site &site) {
  make_read_only(outs);
  if (!any_kept(outs, ins, false)) return any_kept(outs, ins, true);
  if (process->collect_garbage.is_valid()) process->collect_garbage();
  if (!any_kept(outs, ins, false)) return any_kept(outs, ins, true);
  nb::list moved;
  for (const nb::object *views : {&outs, &ins}) {
    bool tuple_kept = Py_REFCNT(views->ptr()) > 1;
    for (nb::handle view : nb::borrow<nb::tuple>(*views)) {
      // held weakly only: it dies with the call (its views are not reused), and its
      // weak references with it, so it needs no copy
      if (!tuple_kept && Py_REFCNT(view.ptr()) == 1) continue;
      auto *array = reinterpret_cast<PyArrayObject *>(view.ptr());
      if (PyArray_BASE(array) != nullptr) continue;
      Py_ssize_t holders = Py_REFCNT(view.ptr()) - 1;  // all but the tuple's reference
      moved.append(nb::make_tuple(reinterpret_cast<uintptr_t>(PyArray_DATA(array)),
                                  static_cast<int64_t>(PyArray_NBYTES(array)), view,
                                  static_cast<int64_t>(holders)));
      detach(view.ptr());
    }
  }
  if (process->escaped.is_valid() && nb::len(moved) > 0)
    process->escaped(site.label, moved, outs, ins);
  return true;
}

}  // namespace jaxbind
