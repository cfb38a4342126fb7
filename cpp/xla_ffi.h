// The XLA FFI API header (from jaxlib), included through this file only, and what
// jaxbind's handlers decode from a call's execution context.
//
// The header tests compiler attributes with `__has_attribute`, which MSVC does not
// define: there, no attribute is taken as available.
#pragma once

#ifndef __has_attribute
#define __has_attribute(x) 0
#endif

#include <optional>

#include "xla/ffi/api/ffi.h"

namespace jaxbind {

// A call's execution context, as jaxbind uses it through XLA's C API directly: the slot
// XLA keeps for the call site (xla_slot.h) and XLA's intra-op thread pool (workers.h).
// Decoded once per handler; null fields: none (then no slot, and serial work).
struct ExecutionContext {
  const XLA_FFI_Api *api = nullptr;
  XLA_FFI_ExecutionContext *ctx = nullptr;
};

// Free an error a C API function returned (jaxbind only ever drops such errors: what
// failed is then done without, as the callers say).
inline void destroy_error(const XLA_FFI_Api *api, XLA_FFI_Error *error) {
  XLA_FFI_Error_Destroy_Args args{};
  args.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  args.error = error;
  api->XLA_FFI_Error_Destroy(&args);
}

}  // namespace jaxbind

// Decoded as ffi::ThreadPool is, but never a diagnostic: a context without a pool or a
// slot only means serial work, or an Instance found through the other door (site_life.h).
template <>
struct xla::ffi::CtxDecoding<jaxbind::ExecutionContext> {
  using Type = jaxbind::ExecutionContext;
  static std::optional<Type> Decode(const XLA_FFI_Api *api, XLA_FFI_ExecutionContext *ctx,
                                    DiagnosticEngine &) {
    return jaxbind::ExecutionContext{api, ctx};
  }
};
