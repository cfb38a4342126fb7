// jaxbind's C runtime: the few structures of the PJRT C API (XLA's pjrt_c_api.h and
// pjrt_c_api_ffi_extension.h) it uses, declared here in the layout XLA keeps stable
// (fields are only appended; every struct starts with its size): the head of PJRT_Api (its
// extension chain, its version, and the two error functions that follow), the extension
// chain's links, and the FFI extension's handler registration. The runtime needs nothing
// else of the plugin: XLA calls its handlers through the FFI C API (xla_ffi.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace jaxbind::runtime::pjrt {

struct Error;  // PJRT_Error: opaque

// PJRT_Extension_Base
struct ExtensionBase {
  size_t struct_size;
  int type;  // PJRT_Extension_Type (an enum: int-sized)
  ExtensionBase *next;
};

// PJRT_Extension_Type_FFI: the sixth of the enum since the FFI extension appeared
constexpr int kExtensionFfi = 5;

// PJRT_Api_Version
struct ApiVersion {
  size_t struct_size;
  ExtensionBase *extension_start;
  int major_version;
  int minor_version;
};

struct ErrorDestroyArgs {  // PJRT_Error_Destroy_Args
  size_t struct_size;
  ExtensionBase *extension_start;
  Error *error;
};

struct ErrorMessageArgs {  // PJRT_Error_Message_Args
  size_t struct_size;
  ExtensionBase *extension_start;
  const Error *error;
  const char *message;  // out
  size_t message_size;  // out
};

// The head of PJRT_Api: its first fields, in order.
struct ApiHead {
  size_t struct_size;
  ExtensionBase *extension_start;
  ApiVersion pjrt_api_version;
  void (*error_destroy)(ErrorDestroyArgs *);
  void (*error_message)(ErrorMessageArgs *);
};

// PJRT_FFI_Register_Handler_Args, as the CPU plugins of PJRT C API 0.81 to 0.115 read it
// (the typed FFI handlers' registration; an earlier layout had an `api_version` int before
// the handler: its plugins read this one's handler as that int and fail)
struct RegisterHandlerArgs {
  size_t struct_size;
  const char *target_name;
  size_t target_name_size;
  void *handler;  // XLA_FFI_Handler *
  const char *platform_name;
  size_t platform_name_size;
  int traits;  // PJRT_FFI_Handler_TraitsBits
};

// PJRT_FFI_Extension: its registration of an FFI handler comes third.
struct FfiExtension {
  ExtensionBase base;
  void *type_id_register;
  void *user_data_add;
  Error *(*register_handler)(RegisterHandlerArgs *);
};

}  // namespace jaxbind::runtime::pjrt
