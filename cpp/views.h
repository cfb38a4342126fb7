// jaxbind's trampoline: NumPy views of XLA's host buffers for CPU calls.
#pragma once

#include "state.h"

namespace jaxbind {

// One buffer as the callable sees it: with levels > 0 and `batched`, batch
// element `element` (the leading `levels` axes dropped) of the buffer.
struct View {
  ffi::DataType type;
  char *data;
  ffi::Span<const int64_t> dims;
};

// XLA's argument (ffi::RemainingArgs) or result (ffi::RemainingRets) buffers, without
// an ordered call's token: a TOKEN buffer in first place, which carries no data.
template <typename Remaining>
class Buffers {
 public:
  static constexpr bool kResults = std::is_same_v<Remaining, ffi::RemainingRets>;

  explicit Buffers(const Remaining &all) : all_(all) {
    if (all_.size() > 0) {
      auto first = all_.template get<ffi::AnyBuffer>(0);
      if (first.has_value() && element_type(*first) == ffi::DataType::TOKEN) skip_ = 1;
    }
  }
  size_t size() const { return all_.size() - skip_; }
  template <typename T>
  auto get(size_t i) const {
    return all_.template get<T>(i + skip_);
  }

 private:
  template <typename B>
  static ffi::DataType element_type(B b) {
    if constexpr (kResults)
      return (*b).element_type();
    else
      return b.element_type();
  }
  const Remaining &all_;
  size_t skip_ = 0;
};

using Args = Buffers<ffi::RemainingArgs>;
using Rets = Buffers<ffi::RemainingRets>;

// Buffer i of XLA's arguments or results (results come wrapped once more).
template <typename Remaining>
ffi::AnyBuffer buffer_at(const Buffers<Remaining> &buffers, size_t i, const char *what) {
  auto buf = buffers.template get<ffi::AnyBuffer>(i);
  if (!buf.has_value()) throw std::invalid_argument(std::string("cannot decode ") + what);
  if constexpr (Buffers<Remaining>::kResults)
    return **buf;
  else
    return *buf;
}

template <typename Remaining>
View view_of(const Remaining &buffers, size_t i, const char *what, int levels, int64_t element,
             bool batched) {
  ffi::AnyBuffer b = buffer_at(buffers, i, what);
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
inline PyObject *wrap(const View &v, bool writeable, const char *what, size_t index) {
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
  Py_INCREF(reinterpret_cast<PyObject *>(descr));  // PyArray_NewFromDescr steals it
  PyObject *array =
      PyArray_NewFromDescr(&PyArray_Type, descr, static_cast<int>(v.dims.size()), shape, nullptr,
                           v.data, writeable ? NPY_ARRAY_CARRAY : NPY_ARRAY_CARRAY_RO, nullptr);
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
inline bool repoint(PyObject *obj, const View &v, bool writeable) {
  auto *array = reinterpret_cast<PyArrayObject *>(obj);
  auto code = static_cast<size_t>(v.type);
  if (Py_REFCNT(obj) != 1 || weakly_held(obj) || PyArray_BASE(array) != nullptr ||
      code >= kNumDtypes || PyArray_DESCR(array) != state->dtypes[code] ||
      PyArray_NDIM(array) != static_cast<int>(v.dims.size()))
    return false;
  npy_intp stride = PyArray_ITEMSIZE(array);
  for (int d = static_cast<int>(v.dims.size()) - 1; d >= 0; --d) {
    if (PyArray_DIM(array, d) != v.dims[d] || PyArray_STRIDE(array, d) != stride) return false;
    if (v.dims[d] != 0) stride *= v.dims[d];
  }
  reinterpret_cast<PyArrayObject_fields *>(obj)->data = v.data;
  if (writeable)
    PyArray_ENABLEFLAGS(array, NPY_ARRAY_WRITEABLE);
  else
    PyArray_CLEARFLAGS(array, NPY_ARRAY_WRITEABLE);
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
  if (!tuple.is_valid() || Py_REFCNT(tuple.ptr()) != 1 || PyTuple_Size(tuple.ptr()) != n) {
    PyObject *fresh = PyTuple_New(n);
    if (fresh == nullptr) throw nb::python_error();
    tuple = nb::steal(fresh);
  } else if (!PyObject_GC_IsTracked(tuple.ptr())) {
    PyObject_GC_Track(tuple.ptr());  // hidden while cached (see `cache_views`)
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    View v = view_of(buffers, i, what, levels, element, batched.empty() || batched[i]);
    // Functions, not the PyTuple_*_ITEM macros: the limited C API has only these.
    // A fresh tuple's items are NULL, and PyTuple_GetItem reads them as such.
    PyObject *old = PyTuple_GetItem(tuple.ptr(), i);
    if (old != nullptr && repoint(old, v, writeable)) continue;
    if (PyTuple_SetItem(tuple.ptr(), i, wrap(v, writeable, what, i)) != 0)  // drops `old`
      throw nb::python_error();
  }
  return tuple;
}

// The leading `levels` axes of a buffer, or an error if it has fewer axes.
template <typename Remaining>
std::vector<int64_t> leading_axes(const Remaining &buffers, size_t i, int levels,
                                  const char *what) {
  ffi::Span<const int64_t> dims = buffer_at(buffers, i, what).dimensions();
  if (dims.size() < static_cast<size_t>(levels))
    throw std::invalid_argument(std::string(what) + " " + std::to_string(i) + " has rank " +
                                std::to_string(dims.size()) + ", fewer than the call's " +
                                std::to_string(levels) + " batch levels");
  return std::vector<int64_t>(dims.begin(), dims.begin() + levels);
}

// Number of batch elements of a call that jaxbind batches itself, after
// checking the loop against the buffers XLA hands over: one flag per input,
// and every output and every flagged input leads with the same `levels` batch
// axes. Nothing in a program may make the loop step outside a buffer.
inline int64_t batch_size(const Site &site, const Args &args, const Rets &rets) {
  if (site.batched.size() != args.size())
    throw std::invalid_argument("the call's batch flags name " +
                                std::to_string(site.batched.size()) + " inputs, but it has " +
                                std::to_string(args.size()));
  if (rets.size() == 0) throw std::invalid_argument("a batched call needs an output");
  std::vector<int64_t> batch = leading_axes(rets, 0, site.levels, "output");
  auto same = [&](std::vector<int64_t> axes, const char *what, size_t i) {
    if (axes != batch)
      throw std::invalid_argument(std::string(what) + " " + std::to_string(i) +
                                  " does not lead with the batch axes of output 0");
  };
  for (size_t i = 1; i < rets.size(); ++i)
    same(leading_axes(rets, i, site.levels, "output"), "output", i);
  for (size_t i = 0; i < args.size(); ++i)
    if (site.batched[i]) same(leading_axes(args, i, site.levels, "input"), "input", i);
  int64_t n = 1;
  for (int64_t d : batch) n *= d;
  return n;
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
  if (state->collect_garbage.is_valid()) state->collect_garbage();
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
  if (state->escaped.is_valid() && nb::len(moved) > 0) state->escaped(site.label, moved, outs, ins);
  return true;
}

}  // namespace jaxbind
