// The fp32 linear at 512-bit width with packed activations (BLIS scheme: Goto & van de Geijn 2008;
// Van Zee & van de Geijn 2015): y = x W^T (+ bias) over the 16-wide weight panels of gemm.cpp.
//
// The register tile is R (<= 8) rows x P (<= 3) panels = 48 columns in 24 zmm accumulators. Per k it
// loads the P panel vectors and broadcasts R activations from a packed copy of the tile's rows
// (xp[k * R + r]: one contiguous stream instead of R strided ones), 11 loads for 24 FMAs, so it is
// FMA-bound where the 12 x 16 tile of microkernel.h (13 loads for 12 FMAs, 12 strided activation
// streams) is load-bound: one Ice Lake Xeon core, 96 x 576 x 1536, 58 -> 97-109 GFLOP/s (standalone
// harness; ~133 with register-only FMAs). K runs in blocks of kKBlock so
// the P panels' slice (kKBlock x 48 floats, 24 KB) stays in L1 while every row tile of the block
// passes over it; the partial sums wait in y between k blocks (an fp32 store and load are exact).
//
// Each output is still one FMA chain over k = 0 .. K-1 in order from 0, the bias added after it: the
// same bits as microkernel.h's tiles, whatever the tile, the row block or the thread (batch-invariant).
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "microkernel.h"

namespace radixlm_gemm {

constexpr int kPackedRows = 8;        // rows per register tile
constexpr int kPackedPanels = 3;      // 16-wide panels per register tile
constexpr int64_t kKBlock = 128;      // k per pass over a tile's panels
constexpr int64_t kPackedBytes = 640 << 10;  // packed rows of x per block (in L2 while the panels pass)

// Rows per packed block: as many as kPackedBytes hold (at least 96, a multiple of 8), so a weight
// streams from memory once for up to ~270 rows at K = 576 (the lm_head at decode batch 128).
inline int64_t packed_row_block(int64_t K) { return std::max<int64_t>(96, kPackedBytes / (4 * K) / 8 * 8); }

// Scratch of n floats, uninitialized (every element is written before it is read; a zero fill of
// the packed rows would double their writes on every call).
inline std::unique_ptr<float[]> scratch(int64_t n) { return std::unique_ptr<float[]>(new float[n]); }

// Rows [0, R) of x (ldx) as xp[k * R + r], k in [0, K).
template <int R>
inline void pack_rows(const float* x, int64_t ldx, int64_t K, float* xp) {
  for (int64_t k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r) xp[k * R + r] = x[r * ldx + k];
}

// Lines ahead (k steps) at which a slice's first tile asks for its own panels' lines into L1.
constexpr int64_t kL1Ahead = 8;

// y[r, 16 p + j] (+)= sum_{k in [k0, k0 + kc)} xp[k, r] * panel_p[k, j]; first: the chains start at 0,
// else at y's partial sums; bias (non-null on the last k block only) is added after the chain.
// kLeads (a slice's first tile, which meets its panels' lines before any other tile): it asks for
// them into L1 kL1Ahead k steps before it loads them (the slice was fetched into L2 by the previous
// slice's first tile, but an L2 hit per line still stalled that tile to ~3.5x the others), and
// fetches pf (the next slice, pf_panels panels) into L2 line by line (one 64-byte line per k and
// panel). The other tiles run the loop without either (a prefetch in their loop slowed them).
template <int R, int P, bool kLeads>
inline void packed_tile(const float* xp, const float* panel, int64_t ps, int64_t kc, float* y, int64_t ldy, bool first,
                        const float* bias, const float* pf, int64_t pf_panels) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + r * ldy + 16 * p);
  for (int64_t k = 0; k < kc; ++k) {
    __m512 b[P];
    for (int p = 0; p < P; ++p) b[p] = _mm512_loadu_ps(panel + p * ps + k * 16);
    if constexpr (kLeads) {
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(panel + p * ps + (k + kL1Ahead) * 16), _MM_HINT_T0);
      if (pf != nullptr)
        for (int64_t p = 0; p < pf_panels; ++p)
          _mm_prefetch(reinterpret_cast<const char*>(pf + p * ps + k * 16), _MM_HINT_T1);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(xp[k * R + r]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(a, b[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      __m512 o = acc[r][p];
      if (bias != nullptr) o = _mm512_add_ps(o, _mm512_loadu_ps(bias + 16 * p));
      _mm512_storeu_ps(y + r * ldy + 16 * p, o);
    }
}

// Rows [m0, m1) of x packed tile by tile (threads share the tiles): the tile at row m starts at xp + (m - m0) * K.
inline void pack_block(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K, float* xp) {
  parallel_near_equal_tiles<kPackedRows>(m0, m1, 8, [&](auto r, int64_t m) {
    pack_rows<decltype(r)::value>(x + m * ldx, ldx, K, xp + (m - m0) * K);
  });
}

// Rows [m0, m1) (packed by pack_block into xp) times np (<= 3) panels at `panels` (stride ps = K * 16)
// into y's columns (y, bias offset to the first panel's column). next (or null): the slice to fetch
// after the last k block (the next group's panels, next_np of them).
inline void packed_group(const float* xp, int64_t m0, int64_t m1, int64_t K, const float* panels, int64_t ps,
                         int64_t np, float* y, int64_t ldy, const float* bias, const float* next, int64_t next_np) {
  for (int64_t k0 = 0; k0 < K; k0 += kKBlock) {
    const int64_t kc = std::min(kKBlock, K - k0);
    const bool first = k0 == 0, last = k0 + kc == K;
    const float* pk = panels + k0 * 16;
    const float* b = last ? bias : nullptr;
    const float* pf = !last ? pk + kKBlock * 16 : next;  // the slice this thread reads next
    const int64_t pf_np = !last ? np : next_np;
    bool first_tile = true;
    near_equal_tiles<kPackedRows>(m0, m1, [&](auto r, int64_t m) {
      constexpr int R = decltype(r)::value;
      const float* xt = xp + (m - m0) * K + k0 * R;
      float* yt = y + (m - m0) * ldy;
      // kc lines a panel either way (a prefetch past the weight never faults)
      if (first_tile) {
        first_tile = false;
        if (np == 3) packed_tile<R, 3, true>(xt, pk, ps, kc, yt, ldy, first, b, pf, pf_np);
        else if (np == 2) packed_tile<R, 2, true>(xt, pk, ps, kc, yt, ldy, first, b, pf, pf_np);
        else packed_tile<R, 1, true>(xt, pk, ps, kc, yt, ldy, first, b, pf, pf_np);
      } else if (np == 3) packed_tile<R, 3, false>(xt, pk, ps, kc, yt, ldy, first, b, nullptr, 0);
      else if (np == 2) packed_tile<R, 2, false>(xt, pk, ps, kc, yt, ldy, first, b, nullptr, 0);
      else packed_tile<R, 1, false>(xt, pk, ps, kc, yt, ldy, first, b, nullptr, 0);
    });
  }
}

// y (M, N) = x (M, K; row stride ldx) W^T (+ bias) for W packed as (N / 16, K, 16) panels.
inline void linear_packed_fp32_avx512(const float* x, int64_t ldx, int64_t M, const float* w, int64_t N, int64_t K,
                                      const float* bias, float* y) {
  const int64_t panels = N / 16, ps = K * 16;
  const int64_t groups = (panels + kPackedPanels - 1) / kPackedPanels;
  const int64_t row_block = packed_row_block(K);
  const auto xp = scratch(std::min(M, row_block) * K);
  const radixlm_parallel::Shares s(groups);
  for (int64_t m0 = 0; m0 < M; m0 += row_block) {
    const int64_t m1 = std::min(M, m0 + row_block);
    pack_block(x, ldx, m0, m1, K, xp.get());
    radixlm_parallel::parallel_steal(s.threads, [&](int64_t t) { return s.count(t); }, [&](int64_t, int64_t, auto&& run) {
      run([&](int64_t t, int64_t u) {
        const int64_t g = s.begin(t) + u, p = g * kPackedPanels, np = std::min<int64_t>(kPackedPanels, panels - p);
        const bool more = g + 1 < s.end(t);  // the owner's next group (a thief's prefetch is only wasted)
        packed_group(xp.get(), m0, m1, K, w + p * ps, ps, np, y + m0 * N + p * 16, N,
                     bias != nullptr ? bias + p * 16 : nullptr, more ? w + (p + np) * ps : nullptr,
                     more ? std::min<int64_t>(kPackedPanels, panels - p - np) : 0);
      });
    });
  }
}

}  // namespace radixlm_gemm
