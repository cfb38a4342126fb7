"""Stand-ins for cuFFT and cufinufft on host memory, for the plumbing tests of
jaxbind.contrib.cuda on a machine without a GPU: the libraries' C entry points as their
headers declare them, computing by direct sums on the host memory that stands in for
device memory, and counting what they are asked (plans made and destroyed, the streams
and devices the plans were made for). tests/gpu runs the real libraries."""

CUFFT = r"""
#include <complex.h>
#include <math.h>
#include <stdint.h>

typedef struct { int rank, n[3], type, batch, alive; void *stream; } plan_t;
static plan_t plans[256];
static int64_t made, destroyed;

int cufftPlanMany(int *plan, int rank, int *n, int *inembed, int istride, int idist,
                  int *onembed, int ostride, int odist, int type, int batch) {
  if (made >= 256 || rank < 1 || rank > 3 || inembed || onembed) return 1;
  plan_t *p = &plans[made];
  p->rank = rank; p->type = type; p->batch = batch; p->alive = 1; p->stream = 0;
  for (int a = 0; a < 3; ++a) p->n[a] = a < rank ? n[a] : 1;
  *plan = (int)made++;
  return 0;
}

int cufftSetStream(int plan, void *stream) { plans[plan].stream = stream; return 0; }

#define DFT(NAME, T)                                                                      \
  int NAME(int plan, void *in, void *out, int direction) {                               \
    plan_t *p = &plans[plan];                                                             \
    if (!p->alive) return 2;                                                              \
    int64_t total = (int64_t)p->n[0] * p->n[1] * p->n[2];                                 \
    for (int b = 0; b < p->batch; ++b) {                                                  \
      const T *x = (const T *)in + b * total;                                             \
      T *y = (T *)out + b * total;                                                        \
      for (int64_t k = 0; k < total; ++k) {                                               \
        int64_t k0 = k / (p->n[1] * p->n[2]), k1 = k / p->n[2] % p->n[1], k2 = k % p->n[2]; \
        double complex s = 0;                                                             \
        for (int64_t j = 0; j < total; ++j) {                                             \
          int64_t j0 = j / (p->n[1] * p->n[2]), j1 = j / p->n[2] % p->n[1], j2 = j % p->n[2]; \
          double phase = 2 * M_PI * ((double)k0 * j0 / p->n[0] + (double)k1 * j1 / p->n[1] + \
                                     (double)k2 * j2 / p->n[2]);                          \
          s += x[j] * cexp(direction * I * phase);                                        \
        }                                                                                 \
        y[k] = (T)s;                                                                      \
      }                                                                                   \
    }                                                                                     \
    return 0;                                                                             \
  }
DFT(cufftExecC2C, float complex)
DFT(cufftExecZ2Z, double complex)

int cufftDestroy(int plan) { plans[plan].alive = 0; ++destroyed; return 0; }

/* made, destroyed, and each plan's stream */
void stand_in_counts(int64_t *out) {
  out[0] = made; out[1] = destroyed;
  for (int64_t i = 0; i < made && i < 8; ++i) out[2 + i] = (int64_t)(intptr_t)plans[i].stream;
}
"""

# cufinufft's options, as its _cufinufft.py (2.5.1) declares them (jaxbind reads the
# offsets from there: tests/contrib/test_cuda_libraries.py gives this text to opts_layout)
OPTS_FIELDS = """
    fields = [
        ('upsampfac', c_double),
        ('gpu_method', c_int),
        ('gpu_sort', c_int),
        ('gpu_binsizex', c_int),
        ('gpu_binsizey', c_int),
        ('gpu_binsizez', c_int),
        ('gpu_obinsizex', c_int),
        ('gpu_obinsizey', c_int),
        ('gpu_obinsizez', c_int),
        ('gpu_maxsubprobsize', c_int),
        ('gpu_kerevalmeth', c_int),
        ('gpu_spreadinterponly', c_int),
        ('gpu_maxbatchsize', c_int),
        ('gpu_device_id', c_int),
        ('gpu_stream', c_void_p),
        ('modeord', c_int),
        ('gpu_np', c_int),
        ('debug', c_int)
    ]
"""

CUFINUFFT = r"""
#include <complex.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  double upsampfac;
  int gpu_method, gpu_sort, gpu_binsizex, gpu_binsizey, gpu_binsizez, gpu_obinsizex,
      gpu_obinsizey, gpu_obinsizez, gpu_maxsubprobsize, gpu_kerevalmeth, gpu_spreadinterponly,
      gpu_maxbatchsize, gpu_device_id;
  void *gpu_stream;
  int modeord, gpu_np, debug;
} cufinufft_opts;

typedef struct {
  int type, dim, iflag, modeord;
  int64_t n[3], m;
  const void *xyz[3];
} plan_t;

static int64_t made, destroyed, last_type, last_device, last_stream, setpts_calls;

void cufinufft_default_opts(cufinufft_opts *o) {
  memset(o, 0, sizeof(*o));
  o->upsampfac = 2.0; o->gpu_device_id = 0; o->gpu_stream = 0; o->modeord = 0; o->debug = 7;
}

static int make(int type, int dim, int64_t *n, int iflag, int ntransf, void **plan,
                cufinufft_opts *o) {
  if (ntransf != 1 || dim < 1 || dim > 3 || o->debug != 7) return 1;  /* (7: our defaults) */
  plan_t *p = (plan_t *)calloc(1, sizeof(plan_t));
  p->type = type; p->dim = dim; p->iflag = iflag >= 0 ? 1 : -1; p->modeord = o->modeord;
  for (int a = 0; a < 3; ++a) p->n[a] = n[a];
  last_type = type; last_device = o->gpu_device_id; last_stream = (int64_t)(intptr_t)o->gpu_stream;
  ++made;
  *plan = p;
  return 0;
}
/* as cufinufft: an eps finer than the precision makes the plan and returns 1 (a warning) */
int cufinufftf_makeplan(int type, int dim, int64_t *n, int iflag, int ntr, float eps, void **plan,
                        cufinufft_opts *o) {
  int status = make(type, dim, n, iflag, ntr, plan, o);
  return status == 0 && eps < 1.2e-7f ? 1 : status;
}
int cufinufft_makeplan(int type, int dim, int64_t *n, int iflag, int ntr, double eps, void **plan,
                       cufinufft_opts *o) {
  int status = make(type, dim, n, iflag, ntr, plan, o);
  return status == 0 && eps < 2.3e-16 ? 1 : status;
}

static int setpts(void *plan, int64_t m, void *x, void *y, void *z) {
  plan_t *p = (plan_t *)plan;
  p->m = m; p->xyz[0] = x; p->xyz[1] = y; p->xyz[2] = z;
  ++setpts_calls;
  return 0;
}
int cufinufftf_setpts(void *plan, int64_t m, void *x, void *y, void *z, int64_t n, void *s,
                      void *t, void *u) { return setpts(plan, m, x, y, z); }
int cufinufft_setpts(void *plan, int64_t m, void *x, void *y, void *z, int64_t n, void *s,
                     void *t, void *u) { return setpts(plan, m, x, y, z); }

/* the mode of grid index i on an axis of n: modeord 0 from -(n/2), 1 FFT order */
static int64_t mode(int64_t i, int64_t n, int modeord) {
  if (modeord == 0) return i - n / 2;
  return i <= (n - 1) / 2 ? i : i - n;
}

/* C's convention: axis 0 is the fastest, with coordinate xyz[0] */
#define EXECUTE(NAME, R, T)                                                               \
  int NAME(void *plan, T *c, T *f) {                                                      \
    plan_t *p = (plan_t *)plan;                                                           \
    int64_t total = p->n[0] * p->n[1] * p->n[2];                                          \
    for (int64_t j = 0; j < p->m; ++j) {                                                  \
      double complex cj = p->type == 1 ? c[j] : 0;                                        \
      for (int64_t i = 0; i < total; ++i) {                                               \
        int64_t ii[3] = {i % p->n[0], i / p->n[0] % p->n[1], i / (p->n[0] * p->n[1])};    \
        double phase = 0;                                                                 \
        for (int a = 0; a < p->dim; ++a)                                                  \
          phase += mode(ii[a], p->n[a], p->modeord) * ((const R *)p->xyz[a])[j];          \
        double complex e = cexp(p->iflag * I * phase);                                    \
        if (p->type == 1) {                                                               \
          if (j == 0) f[i] = 0;                                                           \
          f[i] += (T)(cj * e);                                                            \
        } else {                                                                          \
          cj += f[i] * e;                                                                 \
        }                                                                                 \
      }                                                                                   \
      if (p->type == 2) c[j] = (T)cj;                                                     \
    }                                                                                     \
    if (p->type == 1 && p->m == 0) for (int64_t i = 0; i < total; ++i) f[i] = 0;         \
    return 0;                                                                             \
  }
EXECUTE(cufinufftf_execute, float, float complex)
EXECUTE(cufinufft_execute, double, double complex)

static int destroy(void *plan) { free(plan); ++destroyed; return 0; }
int cufinufftf_destroy(void *plan) { return destroy(plan); }
int cufinufft_destroy(void *plan) { return destroy(plan); }

/* made, destroyed, the last plan's type, device and stream, setpts calls */
void stand_in_counts(int64_t *out) {
  out[0] = made; out[1] = destroyed; out[2] = last_type; out[3] = last_device;
  out[4] = last_stream; out[5] = setpts_calls;
}
"""
