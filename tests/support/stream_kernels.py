"""Kernels for CUDA (jaxbind.kernel(..., platform="cuda")) written in C without the CUDA
toolkit: they reach the CUDA driver through dlopen("libcuda.so.1"), as a kernel calling
a CUDA library's C entry points reaches that library, and enqueue their work on XLA's
stream. Compiled with the system's C compiler (tests/support/clib.py)."""

SOURCE = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "jaxbind/kernel.h"

typedef int (*copy_fn)(uint64_t dst, uint64_t src, size_t bytes, void *stream);
typedef int (*fill_fn)(uint64_t dst, unsigned int value, size_t count, void *stream);
typedef int (*attribute_fn)(void *data, int attribute, uint64_t pointer);
static copy_fn copy_async;
static fill_fn fill_async;
static attribute_fn pointer_attribute;

static int driver(const jaxbind_call *call) {
  if (copy_async == NULL) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib != NULL) {
      pointer_attribute = (attribute_fn)dlsym(lib, "cuPointerGetAttribute");
      fill_async = (fill_fn)dlsym(lib, "cuMemsetD32Async");
      copy_async = (copy_fn)dlsym(lib, "cuMemcpyDtoDAsync_v2");
    }
  }
  if (copy_async == NULL || fill_async == NULL || pointer_attribute == NULL) {
    snprintf(call->error, (size_t)call->error_size, "cannot load the CUDA driver");
    return 1;
  }
  return 0;
}

static int64_t bytes_of(const jaxbind_buffer *b) {
  int64_t n = b->dtype == JAXBIND_FLOAT64 ? 8 : 4;
  for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d];
  return n;
}

/* A C state per device: the device it was set up for, and the stream it was told. */
typedef struct { int64_t device, stream; } placed;

int32_t placed_setup(const jaxbind_setup *setup, void **state) {
  if (setup->abi_version < 4 || setup->platform != JAXBIND_PLATFORM_CUDA) {
    snprintf(setup->error, (size_t)setup->error_size, "set up outside a GPU call");
    return 1;
  }
  placed *s = (placed *)calloc(1, sizeof(placed));
  if (s == NULL) return 1;
  s->device = setup->device;
  s->stream = (int64_t)(intptr_t)setup->stream;
  *state = s;
  return 0;
}

void placed_teardown(void *state) { free(state); }

/* out0 = in0 (float32 or float64), copied on XLA's stream; out1, if there is one
   (int32[2]) = the call's device and its state's device (-1: none), written on the
   stream. The call's device must be the one whose memory the buffers are: checked with
   the driver. */
int32_t copy_on_stream(const jaxbind_call *call) {
  if (call->abi_version < 4 || call->platform != JAXBIND_PLATFORM_CUDA) {
    snprintf(call->error, (size_t)call->error_size, "copy_on_stream runs in GPU programs");
    return 1;
  }
  if (driver(call) != 0) return 1;
  int ordinal = -1; /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
  if (pointer_attribute(&ordinal, 9, (uint64_t)(uintptr_t)call->inputs[0].data) != 0 ||
      ordinal != call->device) {
    snprintf(call->error, (size_t)call->error_size,
             "the call says device %ld, the input is on device %d", (long)call->device, ordinal);
    return 1;
  }
  const placed *s = (const placed *)call->state;
  uint64_t out = (uint64_t)(uintptr_t)call->outputs[0].data;
  int bad = copy_async(out, (uint64_t)(uintptr_t)call->inputs[0].data,
                       (size_t)bytes_of(&call->inputs[0]), call->stream);
  if (call->n_outputs > 1) {
    uint64_t where = (uint64_t)(uintptr_t)call->outputs[1].data;
    bad = bad || fill_async(where, (unsigned int)call->device, 1, call->stream);
    bad = bad || fill_async(where + 4, (unsigned int)(s ? s->device : -1), 1, call->stream);
  }
  if (bad) {
    snprintf(call->error, (size_t)call->error_size, "a CUDA driver call failed");
    return 1;
  }
  return 0;
}
"""
