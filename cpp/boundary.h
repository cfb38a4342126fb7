// jaxbind's trampoline: the one error boundary, and the one scope in which Python is
// called.
//
// Every handler (CPU, CUDA, CUDA kernel) and the instantiate stage run their work inside
// `boundary(where, work)`, which returns ffi::Error::Success() or the one error `failure`
// makes of whatever the work threw. Nothing else catches to make an ffi::Error. The words
// of every such error, and the codes of C++'s exceptions, are errors.h's (the kernel fast
// path, which runs no Python, takes its `native_boundary`); Python's exceptions add:
//   KeyboardInterrupt (Python)          kCancelled, and the interrupt raised again
//   another Python exception            a site's: kInternal, formatted by Python with its
//                                       traceback (_runtime/report.py); before a site is
//                                       known, the refusal of the site's maker
//                                       (site_life.h): kInvalidArgument, its message alone
//   PythonGone                          kUnavailable (the interpreter is going away)
//
// `PythonScope` is where C++ needs Python: the handler counted in flight (so that
// `shutdown` waits for it), the interpreter checked, the GIL taken. The handlers, the
// instantiate stage and the state cells (held.h) take Python through it alone.
#pragma once

#include <exception>
#include <optional>
#include <string>

#include "call.h"
#include "errors.h"
#include "process.h"

namespace jaxbind {

// Python was needed, but the interpreter is going away (or jaxbind was never set up).
struct PythonGone : Unavailable {
  PythonGone() : Unavailable("the Python interpreter is not running") {}
};

// Python is needed here: counted in flight first (see `shutdown`), then the interpreter
// checked, then the GIL taken where Python is usable (`ready`). `require` throws
// PythonGone where it is not.
class PythonScope {
 public:
  PythonScope() : ready_(python_is_usable()) {
    if (ready_) gil_.emplace();
  }
  bool ready() const { return ready_; }
  void require() const {
    if (!ready_) throw PythonGone();
  }

 private:
  InFlight counted_;  // (first: counted before the check)
  bool ready_;
  std::optional<nb::gil_scoped_acquire> gil_;
};

// A Python exception's message (str of its value; the GIL held).
inline std::string python_text(nb::python_error &e) {
  try {
    return nb::cast<std::string>(nb::str(e.value()));
  } catch (...) {
    return e.what();
  }
}

// A Python failure in C++ that runs without the GIL (a state's object made for a kernel
// call): its message, taken while the GIL is held, as an error the boundary names.
inline LabelledError python_failure(nb::python_error &e) { return LabelledError(python_text(e)); }

// The one error that any failure of the call at `where` becomes: a Python exception's
// here, the rest errors.h's. Not for abi::__forced_unwind (see `catching`).
inline ffi::Error failure(const Where &where, std::exception_ptr thrown) {
  auto say = [&](ffi::ErrorCode code, const std::string &what) {
    return ffi::Error(code, named(where, what));
  };
  try {
    std::rethrow_exception(thrown);
  } catch (nb::python_error &e) {
    if (!python_is_usable()) return say(ffi::ErrorCode::kUnavailable, PythonGone().what());
    nb::gil_scoped_acquire gil;  // (held already by a handler's PythonScope)
    if (e.matches(PyExc_KeyboardInterrupt)) {
      // Ctrl-C while Python ran: the call fails, and the interrupt is raised again so
      // that the main thread sees a KeyboardInterrupt at its next bytecode, as a Ctrl-C
      // anywhere else in Python.
      PyErr_SetInterrupt();
      return say(ffi::ErrorCode::kCancelled, "interrupted (KeyboardInterrupt) while Python ran");
    }
    if (where.label == nullptr)  // the site's maker refused: said plainly
      return say(ffi::ErrorCode::kInvalidArgument, python_text(e));
    try {
      nb::str label(where.label->c_str());
      return say(ffi::ErrorCode::kInternal, nb::cast<std::string>(process->formatter(
                                                label, e.type(), e.value(), e.traceback())));
#if defined(__GLIBCXX__)
    } catch (abi::__forced_unwind &) {
      throw;
#endif
    } catch (...) {
      return say(ffi::ErrorCode::kInternal, std::string("its callable failed: ") + e.what());
    }
  } catch (...) {
    return native_failure(where, thrown);  // (C++'s own)
  }
}

// Run `work()` at `where`: ffi::Error::Success(), or the failure it threw as an error.
template <typename Work>
JAXBIND_INLINE ffi::Error boundary(const Where &where, Work &&work) {
  return catching<failure>(where, std::forward<Work>(work));
}

}  // namespace jaxbind
