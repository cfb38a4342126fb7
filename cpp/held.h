// jaxbind's trampoline: Python objects held by C++ objects that may be freed on a thread
// without the GIL (the last counted reference to a site's core or a state's cell can go on
// any thread). A state's cell holds its Python state, and a keyed site its lease, weakly:
// C++ asks them, the GIL taken, for what only Python can do (set an object up, find a key
// value's cell), and must not keep them alive.
#pragma once

#include <nanobind/nanobind.h>

#include "boundary.h"

namespace jaxbind {

namespace nb = nanobind;

// A strong reference to a Python object: it takes the GIL to let go of the object; after
// the interpreter has begun to finalize it leaks it instead (Python must not be touched).
class HeldObject {
 public:
  HeldObject() = default;
  explicit HeldObject(nb::object obj) : ptr_(obj.release().ptr()) {}
  HeldObject(const HeldObject &) = delete;
  HeldObject &operator=(const HeldObject &) = delete;
  ~HeldObject() { reset(); }
  void reset() {
    PyObject *ptr = ptr_;
    ptr_ = nullptr;
    if (ptr == nullptr) return;
    PythonScope python;
    if (python.ready()) Py_DECREF(ptr);
  }
  // The object a weak reference refers to, or None (the GIL held).
  nb::object referent() const {
    if (ptr_ == nullptr) return nb::none();
    return nb::borrow(nb::handle(ptr_)());
  }

 private:
  PyObject *ptr_ = nullptr;
};

// A weak reference to a Python object, asked with the GIL.
class WeakOwner {
 public:
  explicit WeakOwner(nb::handle owner) : ref_(nb::weakref(owner)) {}

  // `ask(owner)` with the GIL taken, while the owner is alive: false (nothing asked) if it
  // is gone. A Python error becomes a LabelledError (its message), PythonGone if the
  // interpreter is going away.
  template <class Ask>
  bool ask(Ask &&ask) const {
    PythonScope python;
    python.require();
    try {
      nb::object owner = ref_.referent();
      if (owner.is_none()) return false;
      ask(owner);
      return true;
    } catch (nb::python_error &e) {
      throw python_failure(e);
    }
  }

  // Let go of the weak reference (the GIL taken).
  void reset() { ref_.reset(); }

 private:
  HeldObject ref_;
};

}  // namespace jaxbind
