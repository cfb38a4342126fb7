// jaxbind's trampoline and C runtime: the words of every error a call returns, and the
// boundary that C++ alone needs (no Python exception can reach it: a compiled kernel's
// call without the GIL, the C runtime's calls). boundary.h adds Python's failures to it.
//
// Every such error reads
//
//     jaxbind: <where>: <what>
//
// <where> is the site's label, "'<binding>' (<role>)[, batched]", once the call's site
// is known, else "'<binding>'" from the call's attributes. A message that names the
// binding already (Python's "jaxbind: 'fft' (the transpose) ...", a kernel's "kernel of
// 'fft' (the function) failed: ...") keeps its words: only "jaxbind: " is put before it
// where it lacks it. The codes of C++'s exceptions:
//   std::invalid_argument               kInvalidArgument (a bad program, or a refused call)
//   Unavailable                         kUnavailable (what the call needs is going away)
//   any other exception                 kInternal
// A thread ended at interpreter exit unwinds (abi::__forced_unwind) through here: that is
// never swallowed.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#if defined(__GLIBCXX__)
#include <cxxabi.h>  // abi::__forced_unwind
#endif

#include "callformat.h"
#include "xla_ffi.h"

#if defined(__GNUC__)
#define JAXBIND_INLINE inline __attribute__((always_inline))
#else
#define JAXBIND_INLINE inline
#endif

namespace jaxbind {

namespace ffi = xla::ffi;

// What the call needs is going away (boundary.h's PythonGone: the interpreter).
struct Unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
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

// The error a C++ exception of the call at `where` becomes. Not for
// abi::__forced_unwind (see `catching`).
inline ffi::Error native_failure(const Where &where, std::exception_ptr thrown) {
  auto say = [&](ffi::ErrorCode code, const std::string &what) {
    return ffi::Error(code, named(where, what));
  };
  try {
    std::rethrow_exception(thrown);
  } catch (Unavailable &e) {
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

using FailureFn = ffi::Error (*)(const Where &, std::exception_ptr);

// Run `work()` at `where`: ffi::Error::Success(), or the error `Fail` makes of what it
// threw. Inlined into its caller: the kernel fast path pays nothing for it (-Os would
// call it).
template <FailureFn Fail, typename Work>
JAXBIND_INLINE ffi::Error catching(const Where &where, Work &&work) {
  try {
    work();
    return ffi::Error::Success();
#if defined(__GLIBCXX__)
  } catch (abi::__forced_unwind &) {
    throw;  // a thread ended at interpreter exit unwinds through here: never swallow it
#endif
  } catch (...) {
    return Fail(where, std::current_exception());
  }
}

// The boundary of work that runs no Python (see the top of this file).
template <typename Work>
JAXBIND_INLINE ffi::Error native_boundary(const Where &where, Work &&work) {
  return catching<native_failure>(where, std::forward<Work>(work));
}

}  // namespace jaxbind
