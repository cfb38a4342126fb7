/* jaxbind/runtime.h: jaxbind's C runtime, for PJRT hosts without Python.
 *
 * A bundle (written in Python by jaxbind.bundle, see docs/without-python.md) is a
 * directory: the program (a serialized StableHLO module), its compile options, and
 * manifest.json, which names every jaxbind call in the program and what computes it (a C
 * kernel: its shared library, relative to the bundle, its symbol and ABI version; its op's
 * C state: setup and teardown). This library (jaxbind.runtime_library() gives its path)
 * runs those calls in any process that loads a PJRT plugin: it needs neither Python nor
 * libpython.
 *
 *     const PJRT_Api *api = GetPjrtApi();          (from the plugin)
 *     if (jaxbind_register(api, "my_bundle") != 0)
 *       fprintf(stderr, "%s\n", jaxbind_error());   (names the op: a missing library, ...)
 *     ... compile and execute the bundle's program with the PJRT C API ...
 *     jaxbind_release();                            (tears the ops' states down)
 *
 * jaxbind_register registers jaxbind's FFI targets with the plugin, through the PJRT C API's
 * FFI extension (once per process), opens the bundle's kernel libraries and finds their
 * symbols. It may be called for several bundles; a call that fails registers nothing of its
 * bundle. A call of the program that the manifest does not list, or whose buffers differ
 * from the manifest's, fails as an FFI error (the execution's error) that names the op.
 *
 * State: the CPU plugin registers an execute stage only, so an op's C state is set up at
 * the first call of a site that uses it, and kept: sites with equal setup arguments (of
 * any role, any bundle) share one object, as in Python. jaxbind_release() tears down every
 * object (no call may be running); a later call sets up again. The objects left are torn
 * down when this library is unloaded (dlclose, or the process's normal exit).
 *
 * The bundle helpers (jaxbind_bundle_*) read what a host needs to compile and call the
 * program: its bytes, its compile options, and its inputs' and outputs' PJRT element types
 * and shapes.
 */
#ifndef JAXBIND_RUNTIME_H_
#define JAXBIND_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JAXBIND_RUNTIME_VERSION 1 /* the manifest format this runtime reads */

struct PJRT_Api; /* the PJRT C API (pjrt_c_api.h), as the plugin's GetPjrtApi() gives it */

/* Register jaxbind's targets with the plugin and the calls of the bundle in `bundle_dir`.
 * Returns 0, or nonzero with the reason in jaxbind_error(). */
int32_t jaxbind_register(const struct PJRT_Api *api, const char *bundle_dir);

/* Tear down every op state set up so far (no call may be running). Returns how many
 * objects were torn down. */
int64_t jaxbind_release(void);

/* The last failure of a jaxbind_* function on this thread ("" if none). */
const char *jaxbind_error(void);

/* A bundle as a host reads it. */
typedef struct jaxbind_bundle jaxbind_bundle;

/* NULL if the bundle cannot be read (the reason in jaxbind_error()). */
jaxbind_bundle *jaxbind_bundle_open(const char *bundle_dir);
void jaxbind_bundle_close(jaxbind_bundle *bundle);

/* The program (StableHLO bytecode, PJRT program format "mlir") and the serialized
 * CompileOptionsProto to compile it with (num_replicas and num_partitions set). */
const char *jaxbind_bundle_program(const jaxbind_bundle *bundle, size_t *size);
const char *jaxbind_bundle_compile_options(const jaxbind_bundle *bundle, size_t *size);

/* The program's inputs and outputs: counts, and for each its PJRT_Buffer_Type, rank,
 * dimensions and size in bytes. Return 0, or nonzero for an index out of range. */
int64_t jaxbind_bundle_n_inputs(const jaxbind_bundle *bundle);
int64_t jaxbind_bundle_n_outputs(const jaxbind_bundle *bundle);
int32_t jaxbind_bundle_input(const jaxbind_bundle *bundle, int64_t i, int32_t *pjrt_type,
                             int64_t *rank, const int64_t **dims, size_t *bytes);
int32_t jaxbind_bundle_output(const jaxbind_bundle *bundle, int64_t i, int32_t *pjrt_type,
                              int64_t *rank, const int64_t **dims, size_t *bytes);

#ifdef __cplusplus
}
#endif

#endif /* JAXBIND_RUNTIME_H_ */
