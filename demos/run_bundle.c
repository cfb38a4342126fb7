/* A PJRT host in C that runs a jaxbind bundle without Python (docs/without-python.md).
 *
 *   run_bundle PLUGIN.so BUNDLE_DIR [INPUT.bin ...] [--repeat N] [--out DIR]
 *
 * Loads a CPU PJRT plugin, registers jaxbind's runtime with it, compiles the bundle's
 * program, runs it on the inputs (raw C-order bytes, one file per input; zeros without),
 * prints each output, and with --out writes output k to DIR/k.bin. --repeat N runs the
 * program N more times and prints the mean time per run. Built against the PJRT C API
 * header a plugin wheel publishes (xla-cpu-pjrt's include/pjrt_c_api.h) and jaxbind's
 * runtime.h:
 *
 *   cc -O2 run_bundle.c -I<pjrt include> -I<jaxbind.kernel_include_dir()> \
 *      <jaxbind.runtime_library()> -ldl -o run_bundle
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jaxbind/runtime.h"
#include "pjrt_c_api.h"

static const PJRT_Api *api;

static void check(PJRT_Error *error, const char *what) {
  if (error == NULL) return;
  PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = error};
  api->PJRT_Error_Message(&m);
  fprintf(stderr, "%s failed: %.*s\n", what, (int)m.message_size, m.message);
  exit(1);
}

static void await_event(PJRT_Event *event) {
  PJRT_Event_Await_Args a = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = event};
  check(api->PJRT_Event_Await(&a), "PJRT_Event_Await");
  PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = event};
  check(api->PJRT_Event_Destroy(&d), "PJRT_Event_Destroy");
}

static void *read_input(const char *path, size_t bytes) {
  char *data = calloc(1, bytes + 1);
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (path && (!f || fread(data, 1, bytes, f) != bytes)) {
    fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path);
    exit(1);
  }
  if (f) fclose(f);
  return data;
}

static void print_output(int k, int32_t type, const void *data, size_t bytes) {
  printf("output %d:", k);
  for (size_t i = 0; type == PJRT_Buffer_Type_F32 && i < bytes / 4; ++i)
    printf(" %.9g", ((const float *)data)[i]);
  for (size_t i = 0; type == PJRT_Buffer_Type_F64 && i < bytes / 8; ++i)
    printf(" %.17g", ((const double *)data)[i]);
  for (size_t i = 0; type == PJRT_Buffer_Type_S32 && i < bytes / 4; ++i)
    printf(" %d", ((const int *)data)[i]);
  if (type != PJRT_Buffer_Type_F32 && type != PJRT_Buffer_Type_F64 && type != PJRT_Buffer_Type_S32)
    printf(" (%zu bytes of PJRT type %d)", bytes, type);
  printf("\n");
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PLUGIN.so BUNDLE_DIR [INPUT.bin ...] [--repeat N] [--out DIR]\n",
            argv[0]);
    return 2;
  }
  const char *inputs[64] = {0}, *out_dir = NULL;
  int n_files = 0, repeat = 0;
  for (int i = 3; i < argc; ++i) {
    if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
      repeat = atoi(argv[++i]);
    else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
      out_dir = argv[++i];
    else if (n_files < 64)
      inputs[n_files++] = argv[i];
  }
  void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!plugin) return fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror()), 1;
  const PJRT_Api *(*get_api)(void) = (const PJRT_Api *(*)(void))dlsym(plugin, "GetPjrtApi");
  if (!get_api) return fprintf(stderr, "%s has no GetPjrtApi\n", argv[1]), 1;
  api = get_api();
  PJRT_Plugin_Initialize_Args init = {.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE};
  check(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");

  /* jaxbind: the bundle's program and shapes, its kernels registered with the plugin */
  jaxbind_bundle *bundle = jaxbind_bundle_open(argv[2]);
  if (!bundle) return fprintf(stderr, "%s\n", jaxbind_error()), 1;
  if (jaxbind_register((const struct PJRT_Api *)api, argv[2]) != 0)
    return fprintf(stderr, "%s\n", jaxbind_error()), 1;

  PJRT_Client_Create_Args create = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE};
  check(api->PJRT_Client_Create(&create), "PJRT_Client_Create");
  PJRT_Client *client = create.client;
  PJRT_Client_AddressableDevices_Args devices = {
      .struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE, .client = client};
  check(api->PJRT_Client_AddressableDevices(&devices), "PJRT_Client_AddressableDevices");

  size_t code_size, options_size;
  const char *code = jaxbind_bundle_program(bundle, &code_size);
  const char *options = jaxbind_bundle_compile_options(bundle, &options_size);
  PJRT_Program program = {.struct_size = PJRT_Program_STRUCT_SIZE,
                          .code = (char *)code,
                          .code_size = code_size,
                          .format = "mlir",
                          .format_size = 4};
  PJRT_Client_Compile_Args compile = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE,
                                      .client = client,
                                      .program = &program,
                                      .compile_options = options,
                                      .compile_options_size = options_size};
  check(api->PJRT_Client_Compile(&compile), "PJRT_Client_Compile");

  int64_t n_in = jaxbind_bundle_n_inputs(bundle), n_out = jaxbind_bundle_n_outputs(bundle);
  PJRT_Buffer *args[64], *outs[64];
  for (int64_t i = 0; i < n_in && i < 64; ++i) {
    int32_t type;
    int64_t rank;
    const int64_t *dims;
    size_t bytes;
    jaxbind_bundle_input(bundle, i, &type, &rank, &dims, &bytes);
    void *data = read_input(i < n_files ? inputs[i] : NULL, bytes);
    PJRT_Client_BufferFromHostBuffer_Args b = {
        .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
        .client = client,
        .data = data,
        .type = (PJRT_Buffer_Type)type,
        .dims = dims,
        .num_dims = (size_t)rank,
        .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
        .device = devices.addressable_devices[0]};
    check(api->PJRT_Client_BufferFromHostBuffer(&b), "PJRT_Client_BufferFromHostBuffer");
    await_event(b.done_with_host_buffer);
    free(data);
    args[i] = b.buffer;
  }

  PJRT_ExecuteOptions run_options = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE};
  PJRT_Buffer *const *arg_list = args;
  PJRT_Buffer **out_list = outs;
  PJRT_Event *done = NULL;
  PJRT_LoadedExecutable_Execute_Args run = {
      .struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
      .executable = compile.executable,
      .options = &run_options,
      .argument_lists = &arg_list,
      .num_devices = 1,
      .num_args = (size_t)n_in,
      .output_lists = &out_list,
      .device_complete_events = &done};
  struct timespec t0, t1, c0, c1;
  for (int r = 0; r <= repeat; ++r) {
    if (r == 1) clock_gettime(CLOCK_MONOTONIC, &t0), clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    check(api->PJRT_LoadedExecutable_Execute(&run), "PJRT_LoadedExecutable_Execute");
    await_event(done); /* a failing jaxbind call fails here, naming its op */
    for (int64_t k = 0; r < repeat && k < n_out; ++k) {
      PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
                                    .buffer = outs[k]};
      check(api->PJRT_Buffer_Destroy(&d), "PJRT_Buffer_Destroy");
    }
  }
  if (repeat > 0) {
    clock_gettime(CLOCK_MONOTONIC, &t1), clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / repeat;
    double cpu = ((c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec)) / 1e3 / repeat;
    printf("per run: %.3f us, CPU %.3f us (%d runs)\n", us, cpu, repeat);
  }

  for (int64_t k = 0; k < n_out && k < 64; ++k) {
    int32_t type;
    int64_t rank;
    const int64_t *dims;
    size_t bytes;
    jaxbind_bundle_output(bundle, k, &type, &rank, &dims, &bytes);
    void *host = malloc(bytes + 1);
    PJRT_Buffer_ToHostBuffer_Args t = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
                                       .src = outs[k],
                                       .dst = host,
                                       .dst_size = bytes};
    check(api->PJRT_Buffer_ToHostBuffer(&t), "PJRT_Buffer_ToHostBuffer");
    await_event(t.event);
    print_output((int)k, type, host, bytes);
    if (out_dir) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%d.bin", out_dir, (int)k);
      FILE *f = fopen(path, "wb");
      if (!f || fwrite(host, 1, bytes, f) != bytes)
        return fprintf(stderr, "cannot write %s\n", path), 1;
      fclose(f);
    }
    free(host);
  }
  /* with /proc, the test checks that no libpython is mapped in this process */
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int python = 0;
  while (maps && fgets(line, sizeof line, maps)) python |= strstr(line, "libpython") != NULL;
  if (maps) fclose(maps), printf("libpython mapped: %s\n", python ? "yes" : "no");
  printf("states torn down: %lld\n", (long long)jaxbind_release());
  jaxbind_bundle_close(bundle);
  return 0;
}
