// The XLA FFI API header (from jaxlib), included through this file only.
//
// The header tests compiler attributes with `__has_attribute`, which MSVC does not
// define: there, no attribute is taken as available.
#pragma once

#ifndef __has_attribute
#define __has_attribute(x) 0
#endif

#include "xla/ffi/api/ffi.h"
