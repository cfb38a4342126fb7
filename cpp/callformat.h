// The call format: the attributes of one jaxbind custom call, as the lowering writes
// them. C++ reads only the header every call starts with (its format and site digest,
// `Header`); jaxbind/_callformat.py (CallAttributes) says what each attribute means,
// reads and checks them, and computes the digest.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "xla_ffi.h"

namespace jaxbind {

namespace ffi = xla::ffi;

// Version of the attribute set a jaxbind custom call carries. Bump it when the
// attributes change, and keep accepting every older value.
//   1: jaxbind_format, site, binding, role, kwargs (jaxbind's own batch loop
//      hidden in kwargs as "batch_axes").
//   2: format 1 plus loop_levels (int32), loop_batched (one uint8 flag per input)
//      and n_fixed (int32); kwargs hold only what the callables receive.
//   3: format 2 plus trees (uint8 array): a pytree-API op's pytree structure, empty
//      for other calls (format 2 kept it among the kwargs).
//   4: format 3 plus definition (string): the op's definition the program was made for
//      (jaxbind/_definition.py), compared with the op's before any body runs.
constexpr int32_t kCallFormat = 4;

// The call's attributes as XLA passes them (its C API struct), for the CPU handler's
// kernel fast path, which reads only the site digest; everything else reads them
// through ffi::Dictionary (`dict`).
struct RawAttrs {
  const XLA_FFI_Attrs *raw;
  ffi::Dictionary dict() const { return ffi::Dictionary(raw); }

  // The `site` attribute (a signed 64-bit scalar). A format-4 call has it as the 9th of
  // its sorted names (a format-3 call as the 8th); any other position is searched.
  bool site(int64_t &out) const {
    auto is_site = [&](int64_t i) {
      const XLA_FFI_ByteSpan *name = raw->names[i];
      return name->len == 4 && std::memcmp(name->ptr, "site", 4) == 0;
    };
    int64_t at = raw->size > 8 && is_site(8) ? 8 : -1;
    for (int64_t i = 0; at < 0 && i < raw->size; ++i)
      if (is_site(i)) at = i;
    if (at < 0 || raw->types[at] != XLA_FFI_AttrType_SCALAR) return false;
    auto *scalar = static_cast<const XLA_FFI_Scalar *>(raw->attrs[at]);
    if (scalar->dtype != XLA_FFI_DataType_S64) return false;
    out = *static_cast<const int64_t *>(scalar->value);
    return true;
  }
};

template <typename T>
bool get_attr(const ffi::Dictionary &attrs, std::string_view name, T &out) {
  auto value = attrs.get<T>(name);
  if (!value.has_value()) return false;
  out = *value;
  return true;
}

// What every call reads before anything else: its format, checked, and the site digest
// (the cache key). Python (jaxbind/_callformat.py, CallAttributes.read) reads and checks
// the other attributes of the call's format when it instantiates a site.
struct Header {
  int32_t format = 0;
  int64_t site = 0;  // signed: jax 0.7 cannot lower uint64 attributes above 2**63

  struct Problem {
    ffi::ErrorCode code = ffi::ErrorCode::kInvalidArgument;
    std::string message;
  };
  // Returns what is wrong (an empty message if nothing is).
  Problem read(const ffi::Dictionary &attrs) {
    if (!get_attr(attrs, "jaxbind_format", format))
      return {ffi::ErrorCode::kInvalidArgument,
              "custom call has no 'jaxbind_format' attribute; it was not made by jaxbind"};
    if (format < 1 || format > kCallFormat)
      return {ffi::ErrorCode::kUnimplemented,
              "program uses jaxbind call format " + std::to_string(format) +
                  ", but this jaxbind reads formats 1 to " + std::to_string(kCallFormat) +
                  "; upgrade jaxbind to run it"};
    if (!get_attr(attrs, "site", site))
      return {ffi::ErrorCode::kInvalidArgument,
              "custom call lacks one of the attributes 'site', 'binding', 'role', 'kwargs' "
              "that call format 1 requires"};
    return {};
  }
};

}  // namespace jaxbind

// Decoding of RawAttrs: all attributes, as they are (see ffi::Dictionary's decoding).
template <>
struct xla::ffi::internal::Decode<xla::ffi::internal::AttrsTag<jaxbind::RawAttrs>> {
  static std::optional<jaxbind::RawAttrs> call(DecodingOffsets &, DecodingContext &ctx,
                                               DiagnosticEngine &) {
    return jaxbind::RawAttrs{&ctx.call_frame->attrs};
  }
};
