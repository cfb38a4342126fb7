/* The C kernels and C state of tests/runtime_c: built by the tests with the C compiler,
 * used in Python (jaxbind.kernel, jaxbind.c_state) and, through a bundle, by jaxbind's C
 * runtime in demos/run_bundle.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jaxbind/kernel.h"

static int64_t elements(const jaxbind_buffer *b) {
  int64_t n = 1;
  for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d];
  return n;
}

static const jaxbind_kwarg *kwarg(const jaxbind_call *call, const char *name) {
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, name) == 0) return &call->kwargs[k];
  return NULL;
}

/* out = factor * x, float32: its own transpose */
int32_t scale(const jaxbind_call *call) {
  const jaxbind_kwarg *factor = kwarg(call, "factor");
  if (call->inputs[0].dtype != JAXBIND_FLOAT32 || factor == NULL) {
    snprintf(call->error, (size_t)call->error_size, "scale takes float32 and factor=");
    return 1;
  }
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  for (int64_t i = 0; i < elements(&call->inputs[0]); ++i) y[i] = (float)factor->float_value * x[i];
  return 0;
}

/* The state: n weights w[i] = 1 + i / n, made once; counted, and reported on stderr. */
static int64_t made, freed;

int32_t weights_setup(const jaxbind_setup *setup, void **state) {
  int64_t n = -1;
  for (int64_t k = 0; k < setup->n_kwargs; ++k)
    if (strcmp(setup->kwargs[k].name, "n") == 0) n = setup->kwargs[k].int_value;
  if (n < 1) {
    snprintf(setup->error, (size_t)setup->error_size, "weights_setup needs n >= 1, got %lld",
             (long long)n);
    return 1;
  }
  double *w = malloc(sizeof(double) * (size_t)(n + 1));
  w[0] = (double)n;
  for (int64_t i = 0; i < n; ++i) w[i + 1] = 1.0 + (double)i / (double)n;
  *state = w;
  fprintf(stderr, "weights_setup n=%lld\n", (long long)n);
  ++made;
  return 0;
}

void weights_teardown(void *state) {
  fprintf(stderr, "weights_teardown n=%lld\n", (long long)((double *)state)[0]);
  ++freed;
  free(state);
}

int64_t weights_made(void) { return made; }
int64_t weights_freed(void) { return freed; }

/* out = w * x, float32, x of the state's n elements: diagonal, its own transpose */
int32_t weighted(const jaxbind_call *call) {
  const double *w = (const double *)call->state;
  if (w == NULL || elements(&call->inputs[0]) != (int64_t)w[0]) {
    snprintf(call->error, (size_t)call->error_size, "weighted: no state, or x not of n elements");
    return 1;
  }
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  for (int64_t i = 0; i < elements(&call->inputs[0]); ++i) y[i] = (float)(w[i + 1] * x[i]);
  return 0;
}

/* Fails, with a message */
int32_t failing(const jaxbind_call *call) {
  snprintf(call->error, (size_t)call->error_size, "failing was called with %lld inputs",
           (long long)call->n_inputs);
  return 3;
}
