/* jaxbind/kernel.h: the C ABI of a jaxbind kernel, a compiled op body.
 *
 * A kernel is a function
 *
 *     int32_t kernel(const jaxbind_call *call);
 *
 * that jaxbind's trampoline calls without the GIL and without Python: it reads the
 * inputs and static keyword arguments in `call` and writes every element of every
 * output. It returns 0 on success. On failure it writes a NUL-terminated message into
 * call->error (at most call->error_size bytes, the NUL included) and returns any other
 * value; the call then fails with a Python exception that names the binding, the role
 * and the message.
 *
 * Register a kernel with jaxbind.kernel(address, abi_version=JAXBIND_KERNEL_ABI_VERSION)
 * (or pass a ctypes or cffi function pointer). jaxbind.kernel_include_dir() is the
 * directory that holds this header.
 *
 * Threads (version 2): call->parallel_for(call, n_tasks, task, context) runs
 * task(context, k) once for every k in [0, n_tasks), on XLA's intra-op thread pool and
 * on the calling thread, and returns when all have returned: 0, or the first nonzero
 * status a task returned (tasks not yet started are then skipped). call->n_threads is
 * how many threads it may use (1: it runs the tasks in order on the calling thread). A
 * task must not write call->error: the kernel writes it after parallel_for returns.
 *
 * State (version 3): call->state is the address the op's state gives for this call
 * (jaxbind.state; the object its setup returned, as an address: see docs/kernels.md),
 * NULL for an op without state. It is valid during the call only. Under the state's
 * concurrency "lock" it is this call's alone while the call runs; under "pool" each
 * call running at once gets an object of its own; under "shared" every call gets the
 * same one at once. The object belongs to the state: the kernel never frees it (the
 * state's teardown does). A kernel of version 1 or 2 cannot see a state: an op with
 * state= refuses it when the op is made.
 *
 * Platforms (version 4): call->platform says where the call runs, and so what the
 * buffers' data pointers address. JAXBIND_PLATFORM_CPU: host memory; call->stream is NULL
 * and call->device is -1. JAXBIND_PLATFORM_CUDA (a kernel registered with
 * jaxbind.kernel(..., platform="cuda")): the buffers are device memory of CUDA device
 * call->device (its ordinal; that device's context is current on the calling thread),
 * and call->stream is XLA's cudaStream_t for the call. Such a kernel runs on the host: it
 * must not read the buffers, but enqueues work that does (a library's entry point, a
 * kernel launch) on call->stream, and returns without waiting for it; XLA orders the
 * program's later work after it. It runs on the calling thread alone (n_threads is 1).
 * Its op's state is per device: set up at the first call on each device, on the call's
 * thread, with that device current (a C state's setup gets the device and stream in
 * jaxbind_setup), and torn down when the last program that uses it is freed.
 *
 * Contract (see docs/kernels.md):
 * - Buffers are C-contiguous and valid during the call only. Inputs are read-only.
 *   Outputs are uninitialized unless they share memory with an input
 *   (input_output_aliases).
 * - A kernel may run concurrently, on several threads, for several calls: it must keep
 *   no unsynchronized global state. It must not call back into Python.
 * - Every field is 8 bytes wide, so other languages can read the structs as arrays of
 *   64-bit words.
 *
 * Versions: JAXBIND_KERNEL_ABI_VERSION grows when a struct changes, and a version only
 * appends fields. A kernel registered for version 1 gets abi_version == 1 and the
 * fields of version 1, unchanged (it never reads the later ones); a version this
 * jaxbind does not know is refused when the kernel is registered.
 */
#ifndef JAXBIND_KERNEL_H_
#define JAXBIND_KERNEL_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JAXBIND_KERNEL_ABI_VERSION 4

/* Where a call runs (version 4): call->platform. */
enum jaxbind_platform { JAXBIND_PLATFORM_CPU = 1, JAXBIND_PLATFORM_CUDA = 2 };

/* Element types: XLA's numbering. */
enum jaxbind_dtype {
  JAXBIND_BOOL = 1,
  JAXBIND_INT8 = 2,
  JAXBIND_INT16 = 3,
  JAXBIND_INT32 = 4,
  JAXBIND_INT64 = 5,
  JAXBIND_UINT8 = 6,
  JAXBIND_UINT16 = 7,
  JAXBIND_UINT32 = 8,
  JAXBIND_UINT64 = 9,
  JAXBIND_FLOAT16 = 10,
  JAXBIND_FLOAT32 = 11,
  JAXBIND_FLOAT64 = 12,
  JAXBIND_COMPLEX64 = 15,
  JAXBIND_BFLOAT16 = 16,
  JAXBIND_COMPLEX128 = 18
};

/* One array: an input, an output, or an array keyword argument. */
typedef struct jaxbind_buffer {
  void *data;          /* C-contiguous */
  int64_t dtype;       /* enum jaxbind_dtype */
  int64_t rank;        /* number of dimensions */
  const int64_t *dims; /* `rank` sizes */
} jaxbind_buffer;

enum jaxbind_kwarg_type {
  JAXBIND_KWARG_INT = 1,    /* int_value */
  JAXBIND_KWARG_FLOAT = 2,  /* float_value */
  JAXBIND_KWARG_BOOL = 3,   /* int_value: 0 or 1 */
  JAXBIND_KWARG_STRING = 4, /* string, string_size bytes of UTF-8 and a NUL */
  JAXBIND_KWARG_ARRAY = 5   /* array: read-only */
};

/* One static keyword argument of the call. */
typedef struct jaxbind_kwarg {
  const char *name; /* NUL-terminated */
  int64_t type;     /* enum jaxbind_kwarg_type */
  int64_t int_value;
  double float_value;
  const char *string;
  int64_t string_size;
  jaxbind_buffer array;
} jaxbind_kwarg;

struct jaxbind_call;

/* A task of parallel_for: returns 0, or a nonzero status that fails the call. */
typedef int32_t (*jaxbind_task_fn)(void *context, int64_t task);

typedef int32_t (*jaxbind_parallel_for_fn)(const struct jaxbind_call *call, int64_t n_tasks,
                                           jaxbind_task_fn task, void *context);

/* One call of a kernel. */
typedef struct jaxbind_call {
  int64_t abi_version; /* the version the kernel was registered for */
  int64_t n_inputs;
  const jaxbind_buffer *inputs;
  int64_t n_outputs;
  const jaxbind_buffer *outputs;
  int64_t n_kwargs;
  const jaxbind_kwarg *kwargs; /* sorted by name */
  /* Kernels registered with batches=True get a whole batch: the leading batch_levels
   * axes of every output, and of each input i with batched[i] != 0, are batch axes.
   * 0 for other kernels, which jaxbind calls once per batch element. */
  int64_t batch_levels;
  const uint8_t *batched;
  char *error; /* the error channel: see above */
  int64_t error_size;
  /* Version 2: threads (see above). */
  int64_t n_threads; /* at least 1 */
  jaxbind_parallel_for_fn parallel_for;
  void *workers; /* jaxbind's, for parallel_for: opaque */
  /* Version 3: the op's state (see above). */
  void *state;
  /* Version 4: where the call runs (see above). */
  int64_t platform; /* enum jaxbind_platform */
  void *stream;     /* CUDA: XLA's cudaStream_t for the call; CPU: NULL */
  int64_t device;   /* CUDA: the device ordinal of the buffers; CPU: -1 */
} jaxbind_call;

typedef int32_t (*jaxbind_kernel_fn)(const jaxbind_call *call);

/* A C state (jaxbind.c_state; docs/without-python.md): an op's state whose setup and
 * teardown are C functions, so that a bundle carries it to a host without Python. The
 * setup makes the object from the setup's keyword arguments (sorted by name, as a
 * kernel's) and stores its address in *state; it returns 0, or writes a NUL-terminated
 * message into setup->error (at most error_size bytes) and returns any other value. The
 * teardown frees the object. jaxbind calls both in Python, and its C runtime
 * (jaxbind/runtime.h) in a host without Python. */
typedef struct jaxbind_setup {
  int64_t abi_version; /* JAXBIND_KERNEL_ABI_VERSION of the caller */
  int64_t n_kwargs;
  const jaxbind_kwarg *kwargs; /* sorted by name */
  char *error;
  int64_t error_size;
  /* Version 4: where the object is for. The state of an op whose kernels run on the CPU
   * has one object (or a pool) for every call: JAXBIND_PLATFORM_CPU, stream NULL, device
   * -1. A CUDA kernel's op has its objects per device: JAXBIND_PLATFORM_CUDA, the device's
   * ordinal (its context current) and the stream of the call that needs the object, on
   * which the setup may enqueue work (it runs before the call's kernel on that stream). */
  int64_t platform; /* enum jaxbind_platform */
  void *stream;
  int64_t device;
} jaxbind_setup;

typedef int32_t (*jaxbind_setup_fn)(const jaxbind_setup *setup, void **state);
typedef void (*jaxbind_teardown_fn)(void *state);

#ifdef __cplusplus
}
#endif

#endif /* JAXBIND_KERNEL_H_ */
