/* Harness for templates/c/vmath.c.j2 (built by scripts/check_vmath.py, used by tests/test_vmath.py).
   Compiled with -include of the rendered model.c.j2 prelude (vf, vbcast, vselect and the vector
   math), with the flags of a real build for one -march. Function numbers follow FUNCTIONS in
   scripts/check_vmath.py. The reference is double-precision libm on the float input. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define LANES ((int)(sizeof(vf) / sizeof(float)))

/* Function number, name: vNAME / sNAME in the prelude, libm_NAME below. */
#define VM_FUNCTIONS(X) \
  X(0, exp) X(1, expm1) X(2, log) X(3, log1p) X(4, tanh) X(5, sigmoid) X(6, erf) X(7, silu) \
  X(8, softplus) X(9, mish) X(10, gelu) X(11, gelu_tanh) X(12, sqrt)

/* The scalar libm forms the kernels use today (compiler/codegen/elementwise.py): the baseline. */
static inline float libm_exp(float x) { return expf(x); }
static inline float libm_expm1(float x) { return expm1f(x); }
static inline float libm_log(float x) { return logf(x); }
static inline float libm_log1p(float x) { return log1pf(x); }
static inline float libm_tanh(float x) { return tanhf(x); }
static inline float libm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float libm_erf(float x) { return erff(x); }
static inline float libm_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float libm_softplus(float x) { return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }
static inline float libm_mish(float x) { return x * tanhf(log1pf(expf(x))); }
static inline float libm_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678f)); }
static inline float libm_sqrt(float x) { return sqrtf(x); }
static inline float libm_gelu_tanh(float x)
{
  return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

#define VM_CASE(k, name) case k: return v##name(x);
static vf apply(int fn, vf x)
{
  switch (fn) {
  VM_FUNCTIONS(VM_CASE)
  default: return x;
  }
}
#undef VM_CASE

#define VM_CASE(k, name) case k: return s##name(x);
static float apply_scalar(int fn, float x)
{
  switch (fn) {
  VM_FUNCTIONS(VM_CASE)
  default: return x;
  }
}
#undef VM_CASE

/* One timing loop per function and flavour, so nothing but the function is in the loop. */
#define VM_LOOPS(k, name) \
  static void loop_v_##name(const float* x, float* y, int64_t n) \
  { \
    for (int64_t i = 0; i < n; i += LANES) { \
      vstore(y + i, v##name(vload(x + i))); \
    } \
  } \
  static void loop_l_##name(const float* x, float* y, int64_t n) \
  { \
    for (int64_t i = 0; i < n; i++) { \
      y[i] = libm_##name(x[i]); \
    } \
  }
VM_FUNCTIONS(VM_LOOPS)

typedef void (*loop_fn)(const float*, float*, int64_t);
#define VM_ENTRY(k, name) {loop_v_##name, loop_l_##name},
static const loop_fn loops[][2] = {VM_FUNCTIONS(VM_ENTRY)};

static double softplus(double x)
{
  return (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x)));
}

static double reference(int fn, double x)
{
  switch (fn) {
  case 0: return exp(x);
  case 1: return expm1(x);
  case 2: return log(x);
  case 3: return log1p(x);
  case 4: return tanh(x);
  case 5: return 1.0 / (1.0 + exp(-x));
  case 6: return erf(x);
  case 7: return x / (1.0 + exp(-x));
  case 8: return softplus(x);
  case 9: return x * tanh(softplus(x));
  case 10: return 0.5 * x * erfc(-x * 0.70710678118654752);
  case 12: return sqrt(x);
  default: {
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
  }
  }
}

/* The float32 ulp at the double r (denormal spacing below FLT_MIN). */
static double ulp_at(double r)
{
  int e;
  frexp(r, &e);
  if (r == 0.0 || e - 1 < -126) {
    return ldexp(1.0, -149);
  }
  return ldexp(1.0, e - 1 - 23);
}

/* Error of y against r in ulp: 0 when equal (incl. both NaN), INFINITY for a NaN or infinity
   where the rounded reference has none. */
static double ulp_error(float y, double r)
{
  if (isnan(r) || isnan(y)) {
    return isnan(r) && isnan(y) ? 0.0 : INFINITY;
  }
  const float rf = (float)r;
  if (isinf(rf) || isinf(y)) {
    return y == rf ? 0.0 : INFINITY;
  }
  return fabs((double)y - r) / ulp_at(r);
}

/* out: [0] max ulp for inputs >= ulp_from, [1] its input bits, [2] max |y - r| over the inputs
   below ulp_from (all where ulp_from is -inf) with a finite rounded reference, [3] its bits, [4] NaN disagreements, [5] the first one's bits,
   [6] max ulp over all inputs, [7] its bits, [8] lanes where the scalar twin differs. */
EXPORT void vm_scan(int fn, int64_t lo, int64_t hi, float ulp_from, double* out)
{
  double best[9] = {0};
  const int64_t chunk = 1 << 16;
#pragma omp parallel
  {
    double mine[9] = {0};
#pragma omp for schedule(dynamic, 4)
    for (int64_t c = lo; c < hi; c += chunk) {
      const int64_t end = c + chunk < hi ? c + chunk : hi;
      for (int64_t b = c; b < end; b += LANES) {
        uint32_t bits[sizeof(vf) / sizeof(float)];
        for (int l = 0; l < LANES; l++) {
          bits[l] = (uint32_t)(b + l < end ? b + l : b);
        }
        vf x;
        memcpy(&x, bits, sizeof x);
        const vf y = apply(fn, x);
        for (int l = 0; l < LANES && b + l < end; l++) {
          const double r = reference(fn, (double)x[l]);
          const double u = ulp_error(y[l], r);
          if (isnan(r) != isnan(y[l]) && mine[4]++ == 0) {
            mine[5] = bits[l];
          }
          if (u > mine[6]) {
            mine[6] = u;
            mine[7] = bits[l];
          }
          if (!(x[l] < ulp_from) && u > mine[0]) {
            mine[0] = u;
            mine[1] = bits[l];
          }
          const int abs_region = ulp_from > -INFINITY ? x[l] < ulp_from : 1;
          if (abs_region && isfinite((float)r) && fabs((double)y[l] - r) > mine[2]) {
            mine[2] = fabs((double)y[l] - r);
            mine[3] = bits[l];
          }
          if (l == LANES - 1 && ((b >> 4) & 255) == 0) {
            const float s = apply_scalar(fn, x[l]);
            /* the same bits, or both NaN (its sign and payload may differ: x86 passes on
               the first NaN operand, and the scalar code may order operands otherwise) */
            if (memcmp(&s, &y[l], sizeof s) != 0 && !(isnan(s) && isnan(y[l]))) {
              mine[8]++;
            }
          }
        }
      }
    }
#pragma omp critical
    {
      for (int k = 0; k < 8; k += 2) {
        if (k != 4 && mine[k] > best[k]) {
          best[k] = mine[k];
          best[k + 1] = mine[k + 1];
        }
      }
      if (mine[4] > 0 && best[4] == 0) {
        best[5] = mine[5];
      }
      best[4] += mine[4];
      best[8] += mine[8];
    }
  }
  memcpy(out, best, sizeof best);
}

/* y = f(x) over n values: full vectors, then the scalar twin on the tail. */
EXPORT void vm_eval(int fn, const float* x, float* y, int64_t n)
{
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    vstore(y + i, apply(fn, vload(x + i)));
  }
  for (; i < n; i++) {
    y[i] = apply_scalar(fn, x[i]);
  }
}

/* Seconds per value of f over x[0..n) (n a multiple of the lanes, in cache), repeated reps
   times on one thread: which 0 the vector function, 1 the scalar libm form. */
EXPORT double vm_time(int fn, int which, const float* x, float* y, int64_t n, int64_t reps)
{
  const loop_fn loop = loops[fn][which != 0];
  const double t0 = omp_get_wtime();
  for (int64_t r = 0; r < reps; r++) {
    loop(x, y, n);
    __asm__ volatile("" : : "r"(y) : "memory");
  }
  return (omp_get_wtime() - t0) / (double)(n * reps);
}
