// XLA's per-site slot, as jaxbind uses it: one object per call site of an executable,
// set when XLA instantiates the site and freed (its deleter called) when XLA frees the
// executable. (XLA's C API calls what the slot holds a "state"; in jaxbind, "state" is
// only an op's state, `jaxbind.state`.)
//
// jaxbind is built against the FFI headers of its oldest jaxlib, and runs in newer ones,
// whose slot API (XLA_FFI_State_*) changed its argument structs twice, with equal sizes
// for different layouts (API 0.1: a deleter with each object; 0.2: a deleter per
// registered type; 0.3: a stage with each object). So the slot is set and read through
// the C API directly, in the layout of the API version the running XLA reports, and the
// type is registered with XLA from here, the first time it is needed (not through
// jaxlib's queue of registrations). Where XLA keeps no slot for a call (it did not
// instantiate the site, or refused the type), `get` gives nullptr (site_life.h then
// takes the other door to the call's Instance).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "xla_ffi.h"

namespace jaxbind::xla_slot {

// The argument structs of each API version (major version 0), as XLA reads them.
struct TypeInfo {  // 0.2 and later
  size_t struct_size;
  void *extension_start;
  void (*deleter)(void *);
};
struct RegisterV1 {  // XLA_FFI_TypeId_Register_Args, 0.1
  size_t struct_size;
  void *extension_start;
  XLA_FFI_ByteSpan name;
  XLA_FFI_TypeId *type_id;
};
struct RegisterV2 {  // XLA_FFI_Type_Register_Args, 0.2 and later
  size_t struct_size;
  void *extension_start;
  XLA_FFI_ByteSpan name;
  XLA_FFI_TypeId *type_id;
  const TypeInfo *type_info;
};
struct SetV1 {  // 0.1
  size_t struct_size;
  void *extension_start;
  XLA_FFI_ExecutionContext *ctx;
  XLA_FFI_TypeId *type_id;
  void *state;
  void (*deleter)(void *);
};
struct GetV1 {  // 0.1 and 0.2 (and Set in 0.2, without the deleter)
  size_t struct_size;
  void *extension_start;
  XLA_FFI_ExecutionContext *ctx;
  XLA_FFI_TypeId *type_id;
  void *state;
};
struct StagedV3 {  // Set and Get, 0.3 and later
  size_t struct_size;
  void *extension_start;
  XLA_FFI_ExecutionContext *ctx;
  int32_t stage;
  XLA_FFI_TypeId *type_id;
  void *state;
};

// The type of what jaxbind keeps in the slot in this process (0 until registered), and the one
// deleter XLA calls for it.
inline XLA_FFI_TypeId type_id{0};
inline void (*deleter)(void *) = nullptr;

inline int minor(const XLA_FFI_Api *api) { return api->api_version.minor_version; }

// Whether jaxbind keeps sites in XLA's slots on this XLA: API 0.2 and later (jaxlib 0.8 and
// later). With API 0.1 (jaxlib 0.7), whose slot object carries its own deleter, freeing an
// executable aborted the process once in CI; there jaxbind keeps nothing in a slot.
inline bool keeps_slots(const XLA_FFI_Api *api) {
  return api != nullptr && api->api_version.major_version == 0 && minor(api) >= 2;
}

// Register the type once per process; false if XLA refused it (then no slot is set).
inline bool registered(const XLA_FFI_Api *api) {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [&] {
    static const char name[] = "jaxbind.site";
    static TypeInfo info{sizeof(TypeInfo), nullptr, nullptr};
    info.deleter = deleter;
    XLA_FFI_ByteSpan span{name, sizeof(name) - 1};
    XLA_FFI_Error *error;
    auto *fn = reinterpret_cast<XLA_FFI_Error *(*)(void *)>(api->XLA_FFI_TypeId_Register);
    if (api->api_version.major_version != 0) return;
    if (minor(api) <= 1) {
      RegisterV1 args{sizeof(RegisterV1), nullptr, span, &type_id};
      error = fn(&args);
    } else {
      RegisterV2 args{sizeof(RegisterV2), nullptr, span, &type_id, &info};
      error = fn(&args);
    }
    if (error != nullptr) {
      destroy_error(api, error);
      return;
    }
    ok = type_id.type_id != 0;
  });
  return ok;
}

// Set the slot of the site being instantiated; false if XLA keeps none (then the object
// is not taken: the caller still owns it).
inline bool set(const ExecutionContext &c, void *object) {
  if (c.api == nullptr || deleter == nullptr || !registered(c.api)) return false;
  auto *fn = reinterpret_cast<XLA_FFI_Error *(*)(void *)>(c.api->XLA_FFI_State_Set);
  XLA_FFI_Error *error;
  int m = minor(c.api);
  if (m <= 1) {
    SetV1 args{sizeof(SetV1), nullptr, c.ctx, &type_id, object, deleter};
    error = fn(&args);
  } else if (m == 2) {
    GetV1 args{sizeof(GetV1), nullptr, c.ctx, &type_id, object};
    error = fn(&args);
  } else {
    StagedV3 args{sizeof(StagedV3), nullptr, c.ctx, XLA_FFI_ExecutionStage_INSTANTIATE,
                  &type_id,         object};
    error = fn(&args);
  }
  if (error == nullptr) return true;
  destroy_error(c.api, error);
  return false;
}

// The object in XLA's slot for the site being executed, or nullptr.
inline void *get(const ExecutionContext &c) {
  if (c.api == nullptr || type_id.type_id == 0) return nullptr;
  auto *fn = reinterpret_cast<XLA_FFI_Error *(*)(void *)>(c.api->XLA_FFI_State_Get);
  XLA_FFI_Error *error;
  void *object = nullptr;
  if (minor(c.api) <= 2) {
    GetV1 args{sizeof(GetV1), nullptr, c.ctx, &type_id, nullptr};
    error = fn(&args);
    object = args.state;
  } else {
    StagedV3 args{sizeof(StagedV3), nullptr, c.ctx, XLA_FFI_ExecutionStage_INSTANTIATE,
                  &type_id,         nullptr};
    error = fn(&args);
    object = args.state;
  }
  if (error == nullptr) return object;
  destroy_error(c.api, error);
  return nullptr;
}

}  // namespace jaxbind::xla_slot
