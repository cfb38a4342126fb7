// jaxbind's trampoline: the one error boundary, and the one scope in which Python is
// called.
//
// Every handler (CPU, CUDA, CUDA kernel), the instantiate stage and the kernel fast path
// run their work inside `boundary(where, work)`, which returns ffi::Error::Success() or
// the one error `failure` makes of whatever the work threw. Nothing else catches to make
// an ffi::Error. The words of every such error:
//
//     jaxbind: <where>: <what>
//
// <where> is the site's label, "'<binding>' (<role>)[, batched]", once the call's site
// is known, else "'<binding>'" from the call's attributes. A message that names the
// binding already (Python's "jaxbind: 'fft' (the transpose) ...", a kernel's "kernel of
// 'fft' (the function) failed: ...") keeps its words: only "jaxbind: " is put before it
// where it lacks it. The codes:
//   KeyboardInterrupt (Python)          kCancelled, and the interrupt raised again
//   another Python exception            a site's: kInternal, formatted by Python with its
//                                       traceback (_runtime/report.py); before a site is
//                                       known, the refusal of the site's maker
//                                       (site_life.h): kInvalidArgument, its message alone
//   std::invalid_argument               kInvalidArgument (a bad program, or a refused call)
//   PythonGone                          kUnavailable (the interpreter is going away)
//   any other exception                 kInternal
// A thread ended at interpreter exit unwinds (abi::__forced_unwind) through here: that is
// never swallowed.
//
// `PythonScope` is where C++ needs Python: the handler counted in flight (so that
// `shutdown` waits for it), the interpreter checked, the GIL taken. The handlers, the
// instantiate stage and the state cells (held.h) take Python through it alone.
#pragma once

#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(__GLIBCXX__)
#include <cxxabi.h>  // abi::__forced_unwind
#endif

#include "call.h"
#include "process.h"

#if defined(__GNUC__)
#define JAXBIND_INLINE inline __attribute__((always_inline))
#else
#define JAXBIND_INLINE inline
#endif

namespace jaxbind {

// Python was needed, but the interpreter is going away (or jaxbind was never set up).
struct PythonGone : std::runtime_error {
  PythonGone() : std::runtime_error("the Python interpreter is not running") {}
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

// Where a failure happened: the site's label once the site is known, else the binding's
// name as the call's attributes give it. Made on every call, so nothing is worked out
// until a failure asks (the attributes are searched for the name then).
struct Where {
  std::string_view binding;                // (empty: none given, or the label's)
  const std::string *label = nullptr;      // "'<binding>' (<role>)[, batched]"
  const ffi::Dictionary *attrs = nullptr;  // where the name is, until `binding` is set
  static Where of_label(const std::string &label) {
    Where where;
    where.label = &label;
    return where;
  }
  static Where of_attrs(const ffi::Dictionary &attrs) {
    Where where;
    where.attrs = &attrs;
    return where;
  }
  // The binding's name: given, or read from the attributes, or the quoted start of the
  // label (empty: none of them).
  std::string_view name() const {
    if (binding.empty() && attrs != nullptr) {
      std::string_view found;
      if (get_attr(*attrs, "binding", found)) return found;
    }
    if (!binding.empty() || label == nullptr) return binding;
    size_t end = label->find("' (", 1);
    if (label->empty() || (*label)[0] != '\'' || end == std::string::npos) return {};
    return std::string_view(*label).substr(1, end - 1);
  }
  std::string quoted() const { return "'" + std::string(name()) + "'"; }
  std::string text() const { return label != nullptr ? *label : quoted(); }
};

// The one format (see the top of this file).
inline std::string named(const Where &where, const std::string &what) {
  const std::string lead = "jaxbind: ";
  bool led = what.compare(0, lead.size(), lead) == 0;
  bool nameless = where.label == nullptr && where.name().empty();
  bool names_it = !where.name().empty() && what.find(where.quoted()) != std::string::npos;
  if (nameless || names_it) return led ? what : lead + what;
  return lead + where.text() + ": " + (led ? what.substr(lead.size()) : what);
}

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

// The one error that any failure of the call at `where` becomes. Not for
// abi::__forced_unwind (see `boundary`).
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
  } catch (PythonGone &e) {
    return say(ffi::ErrorCode::kUnavailable, e.what());
  } catch (std::invalid_argument &e) {
    return say(ffi::ErrorCode::kInvalidArgument, e.what());
  } catch (std::exception &e) {
    return say(ffi::ErrorCode::kInternal, e.what());
  } catch (...) {
    return say(ffi::ErrorCode::kInternal, "unknown C++ exception");
  }
}

// A program the call's header refuses (callformat.h): its format, or its site digest.
inline ffi::Error refused(const ffi::Dictionary &attrs, const Header::Problem &problem) {
  return ffi::Error(problem.code, named(Where::of_attrs(attrs), problem.message));
}

// Run `work()` at `where`: ffi::Error::Success(), or the failure it threw as an error.
// Inlined into its caller: the kernel fast path pays nothing for it (-Os would call it).
template <typename Work>
JAXBIND_INLINE ffi::Error boundary(const Where &where, Work &&work) {
  try {
    work();
    return ffi::Error::Success();
#if defined(__GLIBCXX__)
  } catch (abi::__forced_unwind &) {
    throw;  // a thread ended at interpreter exit unwinds through here: never swallow it
#endif
  } catch (...) {
    return failure(where, std::current_exception());
  }
}

}  // namespace jaxbind
