// cuda_host.h -- the CUDA device dialect of the generated kernels, on the host CPU.
//
// Force-included (g++ -x c++ -include cuda_host.h) ahead of a generated model.cu, it turns every
// __global__ function into a plain C++ function and runs one launch block by block: the threads
// of a block are cooperatively switched fibers (one stack each), so __syncthreads and the warp
// shuffles / votes have their real semantics -- a fiber waits there until the threads it waits
// for arrive. What a GPU leaves undefined or hangs on is an error here, reported by the launch's
// return value and oa_last_error() (naming the kernel, block and thread), never a hang:
//   - a __syncthreads that part of the block never reaches (threads exited, or wait elsewhere);
//   - a warp operation whose mask leaves out the calling lane, names a lane that exited, does
//     not exist or waits elsewhere, whose lanes disagree on the mask, or that reads a lane
//     outside the mask;
//   - a memory fault (SIGSEGV / SIGBUS) inside a kernel: arenas from oa_host_alloc have
//     inaccessible pages on both sides, weights are read-only.
// Static shared memory (__shared__) lives in the section "oa_shared" and dynamic shared memory
// (extern __shared__, rewritten by the runner into a pointer) in a buffer of exactly the launch's
// size below a guard page;
// both are filled with 0xff bytes (NaN as float) before every block, so a kernel that reads
// shared memory no thread of its block wrote (a missing barrier) reads NaN.
// One launch runs at a time per process (the state is static); blocks run one after another,
// threads in order of their linear index (descending after oa_set_order(1)), each until it blocks
// or returns.
#pragma once

#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <utility>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// -- the dialect ----------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static __attribute__((section("oa_shared"), aligned(16)))
#define __constant__ static

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

static const int warpSize = 32;

enum { OA_RUN = 0, OA_BARRIER = 1, OA_WARP = 2, OA_DONE = 3 };
enum { OA_SHFL = 1, OA_SHFL_XOR, OA_SHFL_UP, OA_SHFL_DOWN, OA_BALLOT, OA_SYNCWARP };

struct oa_fiber {
  void* sp;  // saved stack pointer (x86-64 switch)
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  uint3 tid;
  unsigned linear, warp, lane;
  int state;
  // the warp operation this fiber waits in
  int wop;
  unsigned wmask;
  int warg, wwidth;
  uint64_t win, wout;
};

#define OA_MAX_THREADS 1024
#define OA_STACK (64 * 1024)

static oa_fiber oa_fibers[OA_MAX_THREADS];
static oa_fiber* oa_cur;
static int oa_nthreads, oa_ndone, oa_at_barrier;
static void* oa_sched_sp;
#if !defined(__x86_64__)
static ucontext_t oa_sched_uc;
#endif
static char* oa_stacks;
static size_t oa_page;
static void (*oa_body)(void*);
static void* oa_body_arg;
static const char* oa_kernel;
static int oa_failed;
static char oa_error[1024];
static sigjmp_buf oa_fault_jmp;
static volatile sig_atomic_t oa_in_launch;
static void* oa_fault_addr;
static int oa_fault_sig;
static unsigned char* oa_dyn_shared;
static int oa_reverse;  // run blocks and threads in descending order (oa_set_order)
static size_t oa_dyn_shared_nbytes;

static uint3 blockIdx;
static dim3 blockDim, gridDim;
#define threadIdx (oa_cur->tid)

extern "C" char __start_oa_shared[] __attribute__((weak));
extern "C" char __stop_oa_shared[] __attribute__((weak));

// -- context switching ----------------------------------------------------------------------------
#if defined(__x86_64__)
// oa_switch(save, to): push the callee-saved registers and the SSE / x87 control words, store the
// stack pointer into *save, continue on the stack `to` (saved the same way).
extern "C" void oa_switch(void** save, void* to);
asm(R"(
  .text
  .p2align 4
  .type oa_switch, @function
  .globl oa_switch
  .hidden oa_switch
oa_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size oa_switch, .-oa_switch
)");
#endif

static void oa_fiber_main();

static void oa_to_scheduler() {
#if defined(__x86_64__)
  oa_switch(&oa_cur->sp, oa_sched_sp);
#else
  swapcontext(&oa_cur->uc, &oa_sched_uc);
#endif
}

static void oa_resume(oa_fiber* f) {
  oa_cur = f;
#if defined(__x86_64__)
  oa_switch(&oa_sched_sp, f->sp);
#else
  swapcontext(&oa_sched_uc, &f->uc);
#endif
}

static void oa_start_fiber(oa_fiber* f, int index) {
  char* base = oa_stacks + (size_t)index * (OA_STACK + oa_page) + oa_page;  // above its guard page
#if defined(__x86_64__)
  uint64_t* top = (uint64_t*)(base + OA_STACK);  // 16-byte aligned
  top[-1] = 0;                                    // oa_fiber_main never returns
  top[-2] = (uint64_t)(uintptr_t)&oa_fiber_main;  // `ret` of the first switch lands here
  for (int r = 3; r <= 8; ++r) top[-r] = 0;       // rbp rbx r12 r13 r14 r15
  uint32_t* control = (uint32_t*)&top[-9];
  control[0] = 0x1f80;  // MXCSR default
  control[1] = 0x037f;  // x87 control word default
  f->sp = &top[-9];
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = base;
  f->uc.uc_stack.ss_size = OA_STACK;
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, oa_fiber_main, 0);
#endif
}

// -- errors ---------------------------------------------------------------------------------------
static void oa_fail_at(const oa_fiber* f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void oa_fail_at(const oa_fiber* f, const char* fmt, ...) {
  if (oa_failed) return;
  oa_failed = 1;
  int n = snprintf(oa_error, sizeof oa_error, "kernel %s block (%u,%u,%u)", oa_kernel, blockIdx.x, blockIdx.y,
                   blockIdx.z);
  if (f != nullptr && n > 0 && (size_t)n < sizeof oa_error)
    n += snprintf(oa_error + n, sizeof oa_error - n, " thread (%u,%u,%u)", f->tid.x, f->tid.y, f->tid.z);
  if (n > 0 && (size_t)n < sizeof oa_error) {
    oa_error[n++] = ':';
    oa_error[n++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(oa_error + n, sizeof oa_error - n, fmt, ap);
    va_end(ap);
  }
}

// A failed check inside a fiber: record it and leave the fiber for good (the launch stops).
[[noreturn]] static void oa_abort_fiber() {
  oa_cur->state = OA_DONE;
  oa_to_scheduler();
  __builtin_unreachable();
}

static const char* oa_state_name(int state) {
  switch (state) {
    case OA_RUN: return "runnable";
    case OA_BARRIER: return "waiting at __syncthreads";
    case OA_WARP: return "waiting in a warp operation";
    default: return "exited";
  }
}

// -- __syncthreads --------------------------------------------------------------------------------
static void oa_first_exited(char* out, size_t n) {
  for (int i = 0; i < oa_nthreads; ++i) {
    if (oa_fibers[i].state == OA_DONE) {
      snprintf(out, n, "(%u,%u,%u)", oa_fibers[i].tid.x, oa_fibers[i].tid.y, oa_fibers[i].tid.z);
      return;
    }
  }
  snprintf(out, n, "?");
}

static void oa_partial_barrier(const oa_fiber* f) {
  char who[48];
  oa_first_exited(who, sizeof who);
  oa_fail_at(f, "__syncthreads reached by %d of %d threads of the block; %d exited before it (first: thread %s)",
             oa_at_barrier, oa_nthreads, oa_ndone, who);
}

static inline void __syncthreads() {
  oa_fiber* f = oa_cur;
  ++oa_at_barrier;
  if (oa_ndone > 0) {
    oa_partial_barrier(f);
    oa_abort_fiber();
  }
  if (oa_at_barrier == oa_nthreads) {
    for (int i = 0; i < oa_nthreads; ++i) oa_fibers[i].state = OA_RUN;
    oa_at_barrier = 0;
    return;
  }
  f->state = OA_BARRIER;
  oa_to_scheduler();
  if (oa_failed) oa_abort_fiber();
}

// -- warp operations ------------------------------------------------------------------------------
static const char* oa_op_name(int op) {
  switch (op) {
    case OA_SHFL: return "__shfl_sync";
    case OA_SHFL_XOR: return "__shfl_xor_sync";
    case OA_SHFL_UP: return "__shfl_up_sync";
    case OA_SHFL_DOWN: return "__shfl_down_sync";
    case OA_BALLOT: return "a vote (__ballot/__any/__all_sync)";
    default: return "__syncwarp";
  }
}

// The lane a shuffle of `f` reads (its own lane when the source falls outside its segment).
static unsigned oa_source_lane(const oa_fiber* f) {
  const unsigned w = (unsigned)f->wwidth, lane = f->lane, seg = lane & ~(w - 1);
  switch (f->wop) {
    case OA_SHFL: return seg + ((unsigned)f->warg & (w - 1));
    case OA_SHFL_XOR: {
      const unsigned s = lane ^ (unsigned)f->warg;
      return (s & ~(w - 1)) == seg ? s : lane;
    }
    case OA_SHFL_UP: return lane - seg >= (unsigned)f->warg ? lane - (unsigned)f->warg : lane;
    case OA_SHFL_DOWN: return lane - seg + (unsigned)f->warg < w ? lane + (unsigned)f->warg : lane;
    default: return lane;
  }
}

// Whether every lane of `mask` waits in the same operation as `f`; first an error for a lane that
// never can (it does not exist or exited), whichever lane arrives first.
static bool oa_warp_complete(oa_fiber* f) {
  const unsigned base = f->warp * 32;
  for (unsigned l = 0; l < 32; ++l) {
    if (!(f->wmask >> l & 1u)) continue;
    const unsigned t = base + l;
    if (t >= (unsigned)oa_nthreads) {
      oa_fail_at(f, "%s mask 0x%08x names lane %u, which does not exist (the block has %d threads)",
                 oa_op_name(f->wop), f->wmask, l, oa_nthreads);
      return false;
    }
    if (oa_fibers[t].state == OA_DONE) {
      oa_fail_at(f, "%s mask 0x%08x names lane %u, which exited", oa_op_name(f->wop), f->wmask, l);
      return false;
    }
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (!(f->wmask >> l & 1u)) continue;
    const oa_fiber* g = &oa_fibers[base + l];
    if (g->state != OA_WARP) return false;
    if (g->wmask != f->wmask || g->wop != f->wop) {
      oa_fail_at(f, "%s mask 0x%08x: lane %u is in %s with mask 0x%08x", oa_op_name(f->wop), f->wmask, l,
                 oa_op_name(g->wop), g->wmask);
      return false;
    }
  }
  return true;
}

static void oa_warp_release(oa_fiber* f) {
  const unsigned base = f->warp * 32;
  uint64_t ballot = 0;
  for (unsigned l = 0; l < 32; ++l)
    if ((f->wmask >> l & 1u) && oa_fibers[base + l].win != 0) ballot |= 1ull << l;
  for (unsigned l = 0; l < 32; ++l) {
    if (!(f->wmask >> l & 1u)) continue;
    oa_fiber* g = &oa_fibers[base + l];
    if (g->wop == OA_BALLOT) {
      g->wout = ballot;
    } else if (g->wop != OA_SYNCWARP) {
      const unsigned src = oa_source_lane(g);
      if (!(g->wmask >> src & 1u)) {
        oa_fail_at(g, "%s reads lane %u, which is not in its mask 0x%08x", oa_op_name(g->wop), src, g->wmask);
        return;
      }
      g->wout = oa_fibers[base + src].win;
    }
    g->state = OA_RUN;
  }
}

static uint64_t oa_warp_op(int op, unsigned mask, uint64_t value, int arg, int width) {
  oa_fiber* f = oa_cur;
  if (!(mask >> f->lane & 1u)) {
    oa_fail_at(f, "%s mask 0x%08x leaves out the calling lane %u", oa_op_name(op), mask, f->lane);
    oa_abort_fiber();
  }
  if (width < 1 || width > 32 || (width & (width - 1))) {
    oa_fail_at(f, "%s width %d is not a power of two up to 32", oa_op_name(op), width);
    oa_abort_fiber();
  }
  f->wop = op;
  f->wmask = mask;
  f->win = value;
  f->warg = arg;
  f->wwidth = width;
  f->state = OA_WARP;
  if (oa_warp_complete(f)) oa_warp_release(f);
  if (oa_failed) oa_abort_fiber();
  if (f->state == OA_WARP) {
    oa_to_scheduler();
    if (oa_failed) oa_abort_fiber();
  }
  return f->wout;
}

template <typename T>
static inline uint64_t oa_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp shuffles move up to 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}

template <typename T>
static inline T oa_from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return oa_from_bits<T>(oa_warp_op(OA_SHFL, mask, oa_bits(v), src, width));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return oa_from_bits<T>(oa_warp_op(OA_SHFL_XOR, mask, oa_bits(v), lane_mask, width));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return oa_from_bits<T>(oa_warp_op(OA_SHFL_UP, mask, oa_bits(v), (int)delta, width));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return oa_from_bits<T>(oa_warp_op(OA_SHFL_DOWN, mask, oa_bits(v), (int)delta, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  return (unsigned)oa_warp_op(OA_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { oa_warp_op(OA_SYNCWARP, mask, 0, 0, 32); }
// The lanes of the caller's warp that have not exited (threads here never diverge within a warp
// in the GPU's sense, so "active" means "still running").
static inline unsigned __activemask() {
  unsigned m = 0;
  const unsigned base = oa_cur->warp * 32;
  for (unsigned l = 0; l < 32 && base + l < (unsigned)oa_nthreads; ++l)
    if (oa_fibers[base + l].state != OA_DONE) m |= 1u << l;
  return m;
}

// -- atomics (one OS thread runs every fiber, and fibers switch only at barriers / warp ops) -------
#define OA_ATOMIC(name, update)      \
  template <typename T>              \
  static inline T name(T* p, T v) {  \
    T old = *p;                      \
    *p = (update);                   \
    return old;                      \
  }
OA_ATOMIC(atomicAdd, old + v)
OA_ATOMIC(atomicSub, old - v)
OA_ATOMIC(atomicMax, old < v ? v : old)
OA_ATOMIC(atomicMin, v < old ? v : old)
OA_ATOMIC(atomicExch, v)
#undef OA_ATOMIC
template <typename T>
static inline T atomicCAS(T* p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}
static inline void __threadfence() {}
static inline void __threadfence_block() {}

// -- math and bit intrinsics ----------------------------------------------------------------------
static inline float __int_as_float(int i) { return oa_from_bits<float>((uint32_t)i); }
static inline int __float_as_int(float f) { return (int)(uint32_t)oa_bits(f); }
static inline float __uint_as_float(unsigned u) { return oa_from_bits<float>(u); }
static inline unsigned __float_as_uint(float f) { return (unsigned)oa_bits(f); }
static inline double __longlong_as_double(long long i) { return oa_from_bits<double>((uint64_t)i); }
static inline long long __double_as_longlong(double d) { return (long long)oa_bits(d); }
// __expf, __logf, __sinf, __cosf, __tanhf, __powf: glibc declares them (the accurate functions).
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
template <typename T>
static inline T __ldg(const T* p) { return *p; }

// -- running a launch -----------------------------------------------------------------------------
static void oa_fiber_main() {
  oa_body(oa_body_arg);
  oa_fiber* f = oa_cur;
  f->state = OA_DONE;
  ++oa_ndone;
  if (oa_at_barrier > 0)
    oa_fail_at(f, "exited while %d of %d threads of the block wait at __syncthreads (a barrier part of the block "
                  "never reaches)", oa_at_barrier, oa_nthreads);
  oa_to_scheduler();
  __builtin_unreachable();
}

static void oa_on_fault(int sig, siginfo_t* info, void*) {
  if (!oa_in_launch) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  oa_fault_sig = sig;
  oa_fault_addr = info->si_addr;
  siglongjmp(oa_fault_jmp, 1);
}

// Stacks for `threads` fibers, each above an inaccessible guard page; mapped per launch and
// unmapped after it (a process may load many modules: mappings are a limited resource).
static size_t oa_stacks_nbytes;

static int oa_map_stacks(int threads) {
  oa_page = (size_t)sysconf(_SC_PAGESIZE);
  oa_stacks_nbytes = (size_t)threads * (OA_STACK + oa_page);
  void* p = mmap(nullptr, oa_stacks_nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return -1;
  oa_stacks = (char*)p;
  for (int i = 0; i < threads; ++i) mprotect(oa_stacks + (size_t)i * (OA_STACK + oa_page), oa_page, PROT_NONE);
  return 0;
}

static void oa_unmap_stacks() {
  if (oa_stacks != nullptr) munmap(oa_stacks, oa_stacks_nbytes);
  oa_stacks = nullptr;
}

// Every thread of the current block, until all return or one fails; 0, or -1 with oa_error set.
static int oa_run_block() {
  oa_ndone = 0;
  oa_at_barrier = 0;
  if (__start_oa_shared != nullptr && __stop_oa_shared != nullptr)
    memset(__start_oa_shared, 0xff, (size_t)(__stop_oa_shared - __start_oa_shared));
  if (oa_dyn_shared_nbytes) memset(oa_dyn_shared, 0xff, oa_dyn_shared_nbytes);
  for (int i = 0; i < oa_nthreads; ++i) {
    oa_fiber* f = &oa_fibers[i];
    f->tid = {(unsigned)i % blockDim.x, (unsigned)i / blockDim.x % blockDim.y, (unsigned)i / (blockDim.x * blockDim.y)};
    f->linear = (unsigned)i;
    f->warp = (unsigned)i / 32;
    f->lane = (unsigned)i % 32;
    f->state = OA_RUN;
    oa_start_fiber(f, i);
  }
  while (oa_ndone < oa_nthreads) {
    bool ran = false;
    for (int k = 0; k < oa_nthreads && !oa_failed; ++k) {
      const int i = oa_reverse ? oa_nthreads - 1 - k : k;
      if (oa_fibers[i].state == OA_RUN) {
        oa_resume(&oa_fibers[i]);
        ran = true;
      }
    }
    if (oa_failed) return -1;
    if (!ran) {  // everyone left waits: name the first waiter
      for (int i = 0; i < oa_nthreads; ++i) {
        const oa_fiber* f = &oa_fibers[i];
        if (f->state == OA_BARRIER) {
          oa_fail_at(f, "__syncthreads never completes: %d of %d threads wait there, the others wait in warp "
                        "operations or exited", oa_at_barrier, oa_nthreads);
          return -1;
        }
        if (f->state == OA_WARP) {
          for (unsigned l = 0; l < 32; ++l) {
            const unsigned t = f->warp * 32 + l;
            if ((f->wmask >> l & 1u) && t < (unsigned)oa_nthreads && oa_fibers[t].state != OA_WARP) {
              oa_fail_at(f, "%s mask 0x%08x waits for lane %u, which is %s", oa_op_name(f->wop), f->wmask, l,
                         oa_state_name(oa_fibers[t].state));
              return -1;
            }
          }
        }
      }
      oa_fail_at(nullptr, "no thread can make progress");
      return -1;
    }
  }
  return 0;
}

extern "C" void* oa_host_alloc(size_t nbytes, size_t align);
extern "C" void oa_host_free(void* ptr, size_t nbytes, size_t align);

// What a GPU refuses to launch: an empty or oversized grid (x < 2^31, y and z <= 65535), more threads
// than the kernel's __launch_bounds__ (or 1024, or block.z > 64), dynamic shared memory over 227 KiB.
static int oa_check_launch(const unsigned* grid, const unsigned* block, unsigned shared, unsigned bound) {
  const unsigned long threads = (unsigned long)block[0] * block[1] * block[2];
  if (threads < 1 || threads > OA_MAX_THREADS || block[2] > 64 || grid[0] < 1 || grid[1] < 1 || grid[2] < 1 ||
      grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535) {
    oa_fail_at(nullptr, "bad launch: grid (%u,%u,%u) block (%u,%u,%u)", grid[0], grid[1], grid[2], block[0],
               block[1], block[2]);
    return -1;
  }
  if (bound > 0 && threads > bound) {
    oa_fail_at(nullptr, "launched with %lu threads per block; its __launch_bounds__ allows %u", threads, bound);
    return -1;
  }
  if (shared > 227u * 1024u) {
    oa_fail_at(nullptr, "launched with %u bytes of dynamic shared memory; a block may have 227 KiB", shared);
    return -1;
  }
  return 0;
}

static int oa_run_grid(const char* name, const unsigned* grid, const unsigned* block, unsigned shared,
                       unsigned bound, void (*body)(void*), void* arg) {
  oa_kernel = name;
  oa_failed = 0;
  oa_error[0] = 0;
  blockIdx = {0, 0, 0};
  if (oa_check_launch(grid, block, shared, bound) != 0) return -1;
  const unsigned long threads = (unsigned long)block[0] * block[1] * block[2];
  if (oa_map_stacks((int)threads) != 0) {
    oa_fail_at(nullptr, "cannot map fiber stacks");
    return -1;
  }
  // dynamic shared memory: exactly `shared` bytes below a guard page, for this launch only
  oa_dyn_shared_nbytes = shared;
  oa_dyn_shared = shared ? (unsigned char*)oa_host_alloc(shared, 4) : nullptr;
  if (shared && oa_dyn_shared == nullptr) {
    oa_unmap_stacks();
    oa_fail_at(nullptr, "cannot map %u bytes of dynamic shared memory", shared);
    return -1;
  }
  gridDim = dim3(grid[0], grid[1], grid[2]);
  blockDim = dim3(block[0], block[1], block[2]);
  oa_nthreads = (int)threads;
  oa_body = body;
  oa_body_arg = arg;

  static char altstack[64 * 1024];
  stack_t ss = {}, old_ss = {};
  ss.ss_sp = altstack;
  ss.ss_size = sizeof altstack;
  sigaltstack(&ss, &old_ss);
  struct sigaction sa = {}, old_segv = {}, old_bus = {};
  sa.sa_sigaction = oa_on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  int status = 0;
  if (sigsetjmp(oa_fault_jmp, 1) != 0) {
    oa_fail_at(oa_cur, "memory fault (%s) at address %p", oa_fault_sig == SIGBUS ? "SIGBUS" : "SIGSEGV",
               oa_fault_addr);
    status = -1;
  } else {
    oa_in_launch = 1;
    for (unsigned z = 0; z < grid[2] && status == 0; ++z)
      for (unsigned y = 0; y < grid[1] && status == 0; ++y)
        for (unsigned x = 0; x < grid[0] && status == 0; ++x) {
          blockIdx = oa_reverse ? uint3{grid[0] - 1 - x, grid[1] - 1 - y, grid[2] - 1 - z} : uint3{x, y, z};
          status = oa_run_block();
        }
  }
  oa_in_launch = 0;
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  sigaltstack(&old_ss, nullptr);
  oa_unmap_stacks();
  if (oa_dyn_shared != nullptr) oa_host_free(oa_dyn_shared, shared, 4);
  oa_dyn_shared = nullptr;
  return status;
}

template <typename... P>
struct oa_call {
  void (*fn)(P...);
  void** args;
  template <size_t... I>
  void invoke(std::index_sequence<I...>) {
    fn(*static_cast<P*>(args[I])...);
  }
  static void run(void* self) { static_cast<oa_call*>(self)->invoke(std::index_sequence_for<P...>{}); }
};

template <typename... P>
static int oa_launch(const char* name, void (*fn)(P...), const unsigned* grid, const unsigned* block,
                     unsigned shared, unsigned bound, void** args) {
  oa_call<P...> call{fn, args};
  return oa_run_grid(name, grid, block, shared, bound, &oa_call<P...>::run, &call);
}

// One kernel's C entry: oa_launch_<name>(grid[3], block[3], dynamic shared bytes, args) where
// args[i] points at the i-th argument's value (cuLaunchKernel's convention); 0 or -1. `bound` is
// the kernel's __launch_bounds__ (0: none).
#define OA_KERNEL(name, bound)                                                                   \
  extern "C" __attribute__((visibility("default"))) int oa_launch_##name(                        \
      const unsigned* grid, const unsigned* block, unsigned shared, void** args) {               \
    return oa_launch(#name, name, grid, block, shared, bound, args);                             \
  }

extern "C" __attribute__((visibility("default"))) const char* oa_last_error() { return oa_error; }

// 1: later launches run blocks and the threads of a block in descending order (a kernel that
// depends on the order, e.g. through a missing barrier, shows it in one order or the other).
extern "C" __attribute__((visibility("default"))) void oa_set_order(int reverse) { oa_reverse = reverse; }

// Host memory with an inaccessible page on each side. The block ends as close to the upper guard
// as `align` (a power of two) allows -- with the element size, a read one element past the end
// faults; the bytes below it, down to the lower guard page, are slack.
static size_t oa_host_span(size_t nbytes, size_t align, size_t* body) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  *body = (nbytes + align - 1) / align * align;
  return (*body + page - 1) / page * page;
}

extern "C" __attribute__((visibility("default"))) void* oa_host_alloc(size_t nbytes, size_t align) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body;
  const size_t span = oa_host_span(nbytes, align, &body);
  char* p = (char*)mmap(nullptr, span + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == (char*)MAP_FAILED) return nullptr;
  mprotect(p, page, PROT_NONE);
  mprotect(p + page + span, page, PROT_NONE);
  return p + page + span - body;
}

extern "C" __attribute__((visibility("default"))) void oa_host_free(void* ptr, size_t nbytes, size_t align) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body;
  const size_t span = oa_host_span(nbytes, align, &body);
  munmap((char*)ptr + body - span - page, span + 2 * page);
}

// Make the pages of an oa_host_alloc block read-only (weights) or writable again.
extern "C" __attribute__((visibility("default"))) int oa_host_protect(void* ptr, size_t nbytes, size_t align,
                                                                     int writable) {
  size_t body;
  const size_t span = oa_host_span(nbytes, align, &body);
  return mprotect((char*)ptr + body - span, span, writable ? PROT_READ | PROT_WRITE : PROT_READ);
}
