// The bf16 linear on AVX512-BF16 (vdpbf16ps; Intel Cooper Lake / Sapphire Rapids, AMD Zen 4 / 5) over
// the pair panels of bf16_dot.h (BLIS scheme: Goto & van de Geijn 2008; Van Zee & van de Geijn 2015):
// y = x W^T (+ bias), x, W, bias and y bf16, accumulated in fp32.
//
// The register tile is R (<= 8) rows x P (<= 3) pair panels = 48 columns in 24 zmm accumulators. Per
// pair of k it loads the P panel vectors (k and k + 1 of 16 columns each) and broadcasts R 32-bit
// activation pairs straight from x's rows (a bf16 pair is 4 contiguous bytes): 11 loads for 24
// vdpbf16ps, where a 12 x 16 tile needs 13 loads for 12. x is not packed: a packed copy (one stream
// instead of R) cost a single-threaded pass over x per call and measured 5-9 % slower at 128-1024
// rows on a Zen 4 (docs/benchmarks.md). K runs
// in blocks of up to kPairKBlock pairs (1024: every K up to 2048 in one block); the partial sums wait
// in an fp32 scratch between k blocks (an fp32 store and load are exact). The P panels' slice of a
// block (up to 1024 x 3 x 64 B = 192 KB) streams from L2 at 8 B a cycle, which the L2 sustains: on a
// Zen 4, blocks of 128 pairs (a 24 KB slice kept in L1) cost every tile a store and reload of its 24
// accumulators per block and ran at 86 % of the vdpbf16ps peak on SmolLM2's shapes, whole-K chains at
// 93-96 % (docs/benchmarks.md, "Zen 4, eleventh session").
//
// Each output is still one chain of vdpbf16ps over k = 0, 2, 4, ... in order from 0, in fp32, the
// bias added after it and the sum rounded to bf16 once (round-to-nearest-even, NaN to 0x7FC0: what
// c10::BFloat16(float) does): a row's result does not depend on the tile, the row block, the k block
// or the thread, so a batch's rows equal the rows computed alone (batch invariance, the property
// SGLang's --enable-deterministic-inference asks of its kernels).
//
// Compiled for AVX-512 builds; the tiles and the rounding store carry target("avx512bf16") and run
// only where the CPU reports the feature (use_bf16_pairs in bf16_dot.h).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "../../elementwise/cpu/bf16_avx512.h"
#include "microkernel.h"

#define RADIXLM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace radixlm_gemm {

constexpr int kPairRows = 8;              // rows per register tile
constexpr int kPairPanels = 3;            // 16-wide pair panels per register tile
constexpr int64_t kPairKBlock = 1024;     // at most this many k pairs per pass over a tile's panels
constexpr int64_t kPairBlockBytes = 640 << 10;  // rows of x per block (in L2 while the panels pass)
constexpr int64_t kPairL1Ahead = 8;       // k pairs ahead at which a slice's first tile asks for its lines
constexpr int kPairStreamRows = 8;        // under this many rows: one panel at a time, front to back

// Rows per block: as many as kPairBlockBytes hold (at least 96, a multiple of 8).
inline int64_t pair_row_block(int64_t K) { return std::max<int64_t>(96, kPairBlockBytes / (2 * K) / 8 * 8); }

// 16 fp32 -> 16 bf16 at y, rounded to nearest even (NaN -> 0x7FC0), bitwise c10::BFloat16(float).
using radixlm_math::store_bf16x16;

// acc[r, 16 p + j] (+)= the chain over kp in [0, kc) of (xt[r, 2 kp], xt[r, 2 kp + 1]) . panel_p[kp, j] (pairs;
// xt's rows ldx elements apart, each pair broadcast straight from x: bf16 pairs are 4 contiguous bytes), starting at
// 0 when first, else at the fp32 partial sums in part (ldp floats a row); on the last k block
// (y non-null) bias is added and the rows rounded into y (ldy), else the sums go back to part.
// kLeads (a slice's first tile): asks for its panels' lines into L1 kPairL1Ahead pairs ahead and
// fetches pf (the next slice, pf_panels panels) into L2, one line per pair and panel.
template <int R, int P, bool kLeads>
RADIXLM_BF16_TARGET inline void pair_tile(const at::BFloat16* xt, int64_t ldx, const at::BFloat16* panel, int64_t ps, int64_t kc,
                                          bool first, float* part, int64_t ldp, at::BFloat16* y, int64_t ldy,
                                          const at::BFloat16* bias, const at::BFloat16* pf, int64_t pf_panels) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + r * ldp + 16 * p);
  for (int64_t kp = 0; kp < kc; ++kp) {
    __m512bh b[P];
    for (int p = 0; p < P; ++p) b[p] = (__m512bh)_mm512_loadu_si512(panel + p * ps + kp * 32);
    if constexpr (kLeads) {
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(panel + p * ps + (kp + kPairL1Ahead) * 32), _MM_HINT_T0);
      if (pf != nullptr)
        for (int64_t p = 0; p < pf_panels; ++p)
          _mm_prefetch(reinterpret_cast<const char*>(pf + p * ps + kp * 32), _MM_HINT_T1);
    }
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, xt + r * ldx + 2 * kp, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], a, b[p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      if (y == nullptr) {
        _mm512_storeu_ps(part + r * ldp + 16 * p, acc[r][p]);
        continue;
      }
      __m512 o = acc[r][p];
      if (bias != nullptr) o = _mm512_add_ps(o, load16(bias + 16 * p));
      store_bf16x16(y + r * ldy + 16 * p, o);
    }
}

template <int R, bool kLeads>
RADIXLM_BF16_TARGET inline void pair_tile_np(int64_t np, const at::BFloat16* xt, int64_t ldx, const at::BFloat16* panel, int64_t ps,
                                             int64_t kc, bool first, float* part, int64_t ldp, at::BFloat16* y,
                                             int64_t ldy, const at::BFloat16* bias, const at::BFloat16* pf,
                                             int64_t pf_panels) {
  if (np == 3) return pair_tile<R, 3, kLeads>(xt, ldx, panel, ps, kc, first, part, ldp, y, ldy, bias, pf, pf_panels);
  if (np == 2) return pair_tile<R, 2, kLeads>(xt, ldx, panel, ps, kc, first, part, ldp, y, ldy, bias, pf, pf_panels);
  pair_tile<R, 1, kLeads>(xt, ldx, panel, ps, kc, first, part, ldp, y, ldy, bias, pf, pf_panels);
}

// Rows [m0, m1) of x (row stride ldx) times np (<= 3) pair panels at `panels` (stride
// ps = K * 16) into y's columns (y, bias offset to the first panel's column); part: (m1 - m0) x 48
// fp32 scratch for the partial sums, needed (non-null) only when K spans several k blocks. next (or null): the slice to
// fetch after the last k block (the next group's panels, next_np of them).
inline void pair_group(const at::BFloat16* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K, const at::BFloat16* panels, int64_t ps,
                       int64_t np, float* part, at::BFloat16* y, int64_t ldy, const at::BFloat16* bias,
                       const at::BFloat16* next, int64_t next_np) {
  const int64_t Kp = K / 2, blocks = (Kp + kPairKBlock - 1) / kPairKBlock;
  const int64_t kb = (Kp + blocks - 1) / blocks;  // near-equal k blocks: 288 pairs as 96 x 3, not 128 + 128 + 32
  constexpr int64_t ldp = 16 * kPairPanels;
  for (int64_t k0 = 0; k0 < Kp; k0 += kb) {
    const int64_t kc = std::min(kb, Kp - k0);
    const bool first = k0 == 0, last = k0 + kc == Kp;
    const at::BFloat16* pk = panels + k0 * 32;
    const at::BFloat16* pf = !last ? pk + kc * 32 : next;  // the slice this thread reads next
    const int64_t pf_np = !last ? np : next_np;
    bool first_tile = true;
    near_equal_tiles<kPairRows>(m0, m1, [&](auto r, int64_t m) {
      constexpr int R = decltype(r)::value;
      const at::BFloat16* xt = x + m * ldx + 2 * k0;
      float* pt = part != nullptr ? part + (m - m0) * ldp : nullptr;
      at::BFloat16* yt = last ? y + (m - m0) * ldy : nullptr;
      if (first_tile) {
        first_tile = false;
        pair_tile_np<R, true>(np, xt, ldx, pk, ps, kc, first, pt, ldp, yt, ldy, bias, pf, pf_np);
      } else {
        pair_tile_np<R, false>(np, xt, ldx, pk, ps, kc, first, pt, ldp, yt, ldy, bias, nullptr, 0);
      }
    });
  }
}

// y (M, N) = x (M, K; row stride ldx, K even) W^T (+ bias) for W packed as (N / 16, K, 16) pair panels.
inline void linear_pairs_bf16_avx512(const at::BFloat16* x, int64_t ldx, int64_t M, const at::BFloat16* w, int64_t N,
                                     int64_t K, const at::BFloat16* bias, at::BFloat16* y) {
  const int64_t panels = N / 16, ps = K * 16;
  const int64_t groups = (panels + kPairPanels - 1) / kPairPanels;
  const int64_t row_block = pair_row_block(K);
  if (M < kPairStreamRows) {
    // Few rows: the weight streams from memory at most once whatever the tiles, so each thread reads
    // its panels front to back (one sequential stream: P = 1, no k blocks, no software prefetch).
    const radixlm_parallel::Shares s(panels);
    radixlm_parallel::parallel_steal(s.threads, [&](int64_t t) { return s.count(t); }, [&](int64_t, int64_t, auto&& run) {
      with_rows<kPairStreamRows - 1>(M, [&](auto r) {
        run([&](int64_t t, int64_t u) {
          const int64_t p = s.begin(t) + u;
          pair_tile<decltype(r)::value, 1, false>(x, ldx, w + p * ps, ps, K / 2, true, nullptr, 0, y + p * 16, N,
                                                  bias != nullptr ? bias + p * 16 : nullptr, nullptr, 0);
        });
      });
    });
    return;
  }
  const bool k_blocks = K / 2 > kPairKBlock;  // partial sums wait in a scratch between k blocks
  const radixlm_parallel::Shares s(groups);
  for (int64_t m0 = 0; m0 < M; m0 += row_block) {
    const int64_t m1 = std::min(M, m0 + row_block);
    radixlm_parallel::parallel_steal(s.threads, [&](int64_t t) { return s.count(t); }, [&](int64_t, int64_t, auto&& run) {
      std::unique_ptr<float[]> part(k_blocks ? new float[(m1 - m0) * 16 * kPairPanels] : nullptr);
      run([&](int64_t t, int64_t u) {
        const int64_t g = s.begin(t) + u, p = g * kPairPanels, np = std::min<int64_t>(kPairPanels, panels - p);
        const bool more = g + 1 < s.end(t);  // the owner's next group (a thief's prefetch is only wasted)
        pair_group(x, ldx, m0, m1, K, w + p * ps, ps, np, part.get(), y + m0 * N + p * 16, N,
                   bias != nullptr ? bias + p * 16 : nullptr, more ? w + (p + np) * ps : nullptr,
                   more ? std::min<int64_t>(kPairPanels, panels - p - np) : 0);
      });
    });
  }
}

}  // namespace radixlm_gemm
