// Reciprocal throughput of the AVX-512 instructions the row kernels are built from, and a check for
// SMT siblings among the CPUs, on the machine it runs on (written for the GPU machine's Xeon VM,
// which has no profiler; docs/benchmarks.md quotes its output).
//
//   gcc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512bf16 -mavx512vbmi -mgfni -mf16c -pthread
//     scripts/avx512-throughput-probe.c -o /tmp/probe && /tmp/probe [NCPUS]
//
// Each row runs 12 independent copies of one instruction (or of a pair) in a loop and prints cycles
// per instruction (per pair): 0.5 means two per cycle (ports 0 and 5), 1.0 one port. Cycles are
// timed against a chain of dependent IMULs (3 cycles each, which no core shortens), so turbo and the
// AVX-512 clock are what they are during the run. The SMT check runs the FMA loop on CPU 0 and CPU k
// at once: siblings would both slow to about twice the solo time.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define ITERS 20000000L
// A dependent chain of 4 IMULs per iteration, 3 cycles each: ns per cycle. (A chain of ADDs with an
// immediate is no clock: Golden Cove folds them at rename and ran it at 4 per cycle.)
static double cycle_ns(void) {
  long x = 3; double t0 = now();
  for (long i = 0; i < ITERS; ++i) __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
  return (now() - t0) / (12.0 * ITERS) * 1e9;
}
#define BODY12(ins) ins(0) ins(1) ins(2) ins(3) ins(4) ins(5) ins(6) ins(7) ins(8) ins(9) ins(10) ins(11)
#define R(n) "%%zmm" #n
// Every zmm the loops read starts at 1.0f (0x3f800000 in each dword): no FP operand is a denormal or
// NaN, whose microcode assists would time the assist, not the instruction.
#define INIT16 __asm__ volatile("vbroadcastss %0, %%zmm0\n\tvmovaps %%zmm0, %%zmm1\n\tvmovaps %%zmm0, %%zmm2\n\t" \
    "vmovaps %%zmm0, %%zmm3\n\tvmovaps %%zmm0, %%zmm4\n\tvmovaps %%zmm0, %%zmm5\n\tvmovaps %%zmm0, %%zmm6\n\t" \
    "vmovaps %%zmm0, %%zmm7\n\tvmovaps %%zmm0, %%zmm8\n\tvmovaps %%zmm0, %%zmm9\n\tvmovaps %%zmm0, %%zmm10\n\t" \
    "vmovaps %%zmm0, %%zmm11\n\tvmovaps %%zmm0, %%zmm12\n\tvmovaps %%zmm0, %%zmm13\n\tvmovaps %%zmm0, %%zmm14\n\t" \
    "vmovaps %%zmm0, %%zmm15\n\tvmovaps %%zmm0, %%zmm16\n\tvmovaps %%zmm0, %%zmm17\n\tvmovaps %%zmm0, %%zmm18\n\t" \
    "vmovaps %%zmm0, %%zmm19\n\tvmovaps %%zmm0, %%zmm20\n\tvmovaps %%zmm0, %%zmm21\n\tvmovaps %%zmm0, %%zmm22\n\t" \
    "vmovaps %%zmm0, %%zmm23\n\tvmovaps %%zmm0, %%zmm24\n\tvmovaps %%zmm0, %%zmm25\n\tvmovaps %%zmm0, %%zmm26\n\t" \
    "vmovaps %%zmm0, %%zmm27" :: "m"(kOne) : CLOBBERS)
#define CLOBBERS "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12", \
    "xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","xmm24","xmm25","xmm26","xmm27"
static const float kOne = 1.0f;
#define T(name, fmt) \
  static double name(void) { INIT16; double t0 = now(); \
    for (long i = 0; i < ITERS / 4; ++i) __asm__ volatile(BODY12(fmt) ::: CLOBBERS); \
    return (now() - t0) / (12.0 * (ITERS / 4)) * 1e9; }
#define FMA(n) "vfmadd231ps %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define DPB(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define DPW(n) "vpdpwssd %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define BF(n) "vdpbf16ps %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define PT2W(n) "vpermt2w %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define PT2B(n) "vpermt2b %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define PW(n) "vpermw %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define PB(n) "vpermb %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define PPS(n) "vpermps %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define SHUF(n) "vpshufb %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define CPH(n) "vcvtph2ps %%ymm13, %%zmm" #n "\n\t"
#define CDQ(n) "vcvtdq2ps %%zmm13, %%zmm" #n "\n\t"
#define SRL(n) "vpsrlw $4, %%zmm13, %%zmm" #n "\n\t"
#define AND(n) "vpandd %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define SXBW(n) "vpmovsxbw %%ymm13, %%zmm" #n "\n\t"
#define MADDUBS(n) "vpmaddubsw %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define MULTISHIFT(n) "vpmultishiftqb %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define FMA_PB(n) "vfmadd231ps %%zmm13, %%zmm14, %%zmm" #n "\n\tvpermb %%zmm13, %%zmm14, %%zmm15\n\t"
#define DPB_PB(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvpermb %%zmm13, %%zmm14, %%zmm15\n\t"
#define DPB_SHUF(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvpshufb %%zmm13, %%zmm14, %%zmm15\n\t"
#define FMA_CDQ(n) "vfmadd231ps %%zmm13, %%zmm14, %%zmm" #n "\n\tvcvtdq2ps %%zmm13, %%zmm15\n\t"
#define DPB_FMA(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvmulps %%zmm13, %%zmm14, %%zmm15\n\t"
#define LD(n) "vmovdqu64 " #n "*64(%%rsp), %%zmm" #n "\n\t"
#define BFADD(n) "vdpbf16ps %%zmm13, %%zmm14, %%zmm" #n "\n\tvpaddd %%zmm13, %%zmm14, %%zmm15\n\t"
#define BFSRL(n) "vdpbf16ps %%zmm13, %%zmm14, %%zmm" #n "\n\tvpsrlw $4, %%zmm13, %%zmm15\n\t"
#define GF(n) "vgf2p8affineqb $0, %%zmm13, %%zmm14, %%zmm" #n "\n\t"
#define SLLM(n) "vpsllw $3, %%zmm13, %%zmm" #n "%{%%k1%}\n\t"
#define DPW_SRL(n) "vpdpwssd %%zmm13, %%zmm14, %%zmm" #n "\n\tvpsrlw $4, %%zmm13, %%zmm15\n\t"
#define DPW_PW(n) "vpdpwssd %%zmm13, %%zmm14, %%zmm" #n "\n\tvpermw %%zmm13, %%zmm14, %%zmm15\n\t"
#define PT2D(n) "vpermt2d %%zmm13, %%zmm14, %%zmm" #n "\n\t"
// X beside a VPADDD (one uop for port 0 or 5): about X's own time if X is one uop on one port, 1.5
// cycles for a one-cycle X of two uops (VPERMW), 1 for a pair of one-uop instructions that share both
// ports (VPDPBUSD).
#define ADD15 "vpaddd %%zmm13, %%zmm14, %%zmm15\n\t"
#define PW_ADD(n) "vpermw %%zmm13, %%zmm14, %%zmm" #n "\n\t" ADD15
#define PB_ADD(n) "vpermb %%zmm13, %%zmm14, %%zmm" #n "\n\t" ADD15
#define CPH_ADD(n) "vcvtph2ps %%ymm13, %%zmm" #n "\n\t" ADD15
#define PT2W_ADD(n) "vpermt2w %%zmm13, %%zmm14, %%zmm" #n "\n\t" ADD15
#define PT2D_ADD(n) "vpermt2d %%zmm13, %%zmm14, %%zmm" #n "\n\t" ADD15
#define SRL_ADD(n) "vpsrlw $4, %%zmm13, %%zmm" #n "\n\t" ADD15
#define BFPB(n) "vdpbf16ps %%zmm13, %%zmm14, %%zmm" #n "\n\tvpermb %%zmm13, %%zmm14, %%zmm15\n\t"
// The pairs of mxfp4's int8 step (fp4_kernels.cpp, step_q8: 2 VPERMB, VPSRLW, 2 VPDPBUSD, VCVTDQ2PS,
// VPERMPS, FMA), the first of each on the 12 chains, the second beside it into zmm15: which of them
// share a pipe (docs/benchmarks.md, thirty-fourth session).
// A second instruction that accumulates goes to a chain of its own, zmm16 + n (HI(n)).
#define HI(n) HI_##n
#define HI_0 "16"
#define HI_1 "17"
#define HI_2 "18"
#define HI_3 "19"
#define HI_4 "20"
#define HI_5 "21"
#define HI_6 "22"
#define HI_7 "23"
#define HI_8 "24"
#define HI_9 "25"
#define HI_10 "26"
#define HI_11 "27"
#define DPB_DPB(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvpdpbusd %%zmm13, %%zmm14, %%zmm" HI(n) "\n\t"
#define DPB_FMA2(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvfmadd231ps %%zmm13, %%zmm14, %%zmm" HI(n) "\n\t"
#define DPB_SRL(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvpsrlw $4, %%zmm13, %%zmm15\n\t"
#define DPB_CDQ(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvcvtdq2ps %%zmm13, %%zmm15\n\t"
#define DPB_ADD(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\t" ADD15
#define DPB_PPS(n) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #n "\n\tvpermps %%zmm13, %%zmm14, %%zmm15\n\t"
#define PB_SRL(n) "vpermb %%zmm13, %%zmm14, %%zmm" #n "\n\tvpsrlw $4, %%zmm13, %%zmm15\n\t"
#define PB_CDQ(n) "vpermb %%zmm13, %%zmm14, %%zmm" #n "\n\tvcvtdq2ps %%zmm13, %%zmm15\n\t"
#define PB_PPS(n) "vpermb %%zmm13, %%zmm14, %%zmm" #n "\n\tvpermps %%zmm13, %%zmm14, %%zmm15\n\t"
#define SRL_CDQ(n) "vpsrlw $4, %%zmm13, %%zmm" #n "\n\tvcvtdq2ps %%zmm13, %%zmm15\n\t"
#define SRL_FMA(n) "vpsrlw $4, %%zmm13, %%zmm" #n "\n\tvfmadd231ps %%zmm13, %%zmm14, %%zmm" HI(n) "\n\t"
T(t_fma, FMA) T(t_dpb, DPB) T(t_dpw, DPW) T(t_bf, BF) T(t_pt2w, PT2W) T(t_pt2b, PT2B) T(t_pw, PW) T(t_pb, PB)
T(t_pps, PPS) T(t_shuf, SHUF) T(t_cph, CPH) T(t_cdq, CDQ) T(t_srl, SRL) T(t_and, AND) T(t_sxbw, SXBW)
T(t_maddubs, MADDUBS) T(t_mshift, MULTISHIFT) T(t_fma_pb, FMA_PB) T(t_dpb_pb, DPB_PB) T(t_dpb_shuf, DPB_SHUF)
T(t_fma_cdq, FMA_CDQ) T(t_dpb_fma, DPB_FMA) T(t_ld, LD) T(t_bfadd, BFADD) T(t_bfsrl, BFSRL) T(t_bfpb, BFPB)
T(t_gf, GF) T(t_sllm, SLLM) T(t_dpw_srl, DPW_SRL) T(t_dpw_pw, DPW_PW) T(t_pt2d, PT2D) T(t_pw_add, PW_ADD)
T(t_pb_add, PB_ADD) T(t_cph_add, CPH_ADD) T(t_pt2w_add, PT2W_ADD) T(t_pt2d_add, PT2D_ADD) T(t_srl_add, SRL_ADD)
T(t_dpb_dpb, DPB_DPB) T(t_dpb_fma2, DPB_FMA2) T(t_dpb_srl, DPB_SRL) T(t_dpb_cdq, DPB_CDQ) T(t_dpb_add, DPB_ADD)
T(t_dpb_pps, DPB_PPS) T(t_pb_srl, PB_SRL) T(t_pb_cdq, PB_CDQ) T(t_pb_pps, PB_PPS) T(t_srl_cdq, SRL_CDQ)
T(t_srl_fma, SRL_FMA)

static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static volatile int go; static double res[2];
static void* worker(void* a) { int c = (int)(long)a; pin(c >= 100 ? c - 100 : c); while (!go) {} res[c >= 100] = t_fma(); return 0; }

int main(int argc, char** argv) {
  pin(0);
  double cy = cycle_ns();
  printf("core clock ~%.2f GHz (dependent IMUL chain)\n", 1.0 / cy);
  struct { const char* n; double (*f)(void); } tests[] = {
    {"vfmadd231ps", t_fma}, {"vpdpbusd", t_dpb}, {"vpdpwssd", t_dpw}, {"vdpbf16ps", t_bf}, {"vpermt2w", t_pt2w},
    {"vpermt2b", t_pt2b}, {"vpermw", t_pw}, {"vpermb", t_pb}, {"vpermps", t_pps}, {"vpshufb", t_shuf},
    {"vcvtph2ps", t_cph}, {"vcvtdq2ps", t_cdq}, {"vpsrlw", t_srl}, {"vpandd", t_and}, {"vpmovsxbw", t_sxbw},
    {"vpmaddubsw", t_maddubs}, {"vpmultishiftqb", t_mshift}, {"fma+vpermb (pair)", t_fma_pb},
    {"vpdpbusd+vpermb (pair)", t_dpb_pb}, {"vpdpbusd+vpshufb (pair)", t_dpb_shuf}, {"fma+cvtdq2ps (pair)", t_fma_cdq},
    {"vpdpbusd+vmulps (pair)", t_dpb_fma}, {"load zmm", t_ld}, {"vdpbf16ps+vpaddd (pair)", t_bfadd},
    {"vdpbf16ps+vpsrlw (pair)", t_bfsrl}, {"vdpbf16ps+vpermb (pair)", t_bfpb}, {"vgf2p8affineqb", t_gf},
    {"vpsllw {k} (merge-masked)", t_sllm}, {"vpdpwssd+vpsrlw (pair)", t_dpw_srl}, {"vpdpwssd+vpermw (pair)", t_dpw_pw},
    {"vpermt2d", t_pt2d}, {"vpermw+vpaddd (pair)", t_pw_add}, {"vpermb+vpaddd (pair)", t_pb_add},
    {"vcvtph2ps+vpaddd (pair)", t_cph_add}, {"vpermt2w+vpaddd (pair)", t_pt2w_add},
    {"vpermt2d+vpaddd (pair)", t_pt2d_add}, {"vpsrlw+vpaddd (pair)", t_srl_add},
    {"vpdpbusd+vpdpbusd (pair)", t_dpb_dpb}, {"vpdpbusd+fma (pair)", t_dpb_fma2}, {"vpdpbusd+vpsrlw (pair)", t_dpb_srl},
    {"vpdpbusd+vcvtdq2ps (pair)", t_dpb_cdq}, {"vpdpbusd+vpaddd (pair)", t_dpb_add}, {"vpdpbusd+vpermps (pair)", t_dpb_pps},
    {"vpermb+vpsrlw (pair)", t_pb_srl}, {"vpermb+vcvtdq2ps (pair)", t_pb_cdq}, {"vpermb+vpermps (pair)", t_pb_pps},
    {"vpsrlw+vcvtdq2ps (pair)", t_srl_cdq}, {"vpsrlw+fma (pair)", t_srl_fma}};
  for (unsigned i = 0; i < sizeof tests / sizeof *tests; ++i) {
    double ns = tests[i].f();
    printf("%-26s %.3f cycles per instruction (group)\n", tests[i].n, ns / cy);
  }
  int n = argc > 1 ? atoi(argv[1]) : 16;
  double solo = t_fma();
  printf("smt probe: fma alone on cpu0 %.3f cyc\n", solo / cy);
  for (int k = 1; k < n; ++k) {
    pthread_t a, b; go = 0;
    pthread_create(&a, 0, worker, (void*)0L); pthread_create(&b, 0, worker, (void*)(long)(100 + k));
    go = 1; pthread_join(a, 0); pthread_join(b, 0);
    printf("cpu0+cpu%d: %.3f / %.3f cyc per fma\n", k, res[0] / cy, res[1] / cy);
  }
  return 0;
}
