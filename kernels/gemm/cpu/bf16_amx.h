// The bf16 linear on AMX tiles (TDPBF16PS; Intel Sapphire Rapids and later) over the pair panels of
// bf16_dot.h: y = x W^T (+ bias), x, W, bias and y bf16, accumulated in fp32.
//
// A pair panel (16 output columns, k-major in pairs of k: 64 bytes per pair of k) is already the
// layout of an AMX B tile: 16 pairs of k x 16 columns are 1,024 contiguous bytes, so the weight packed
// for vdpbf16ps is multiplied here as it is. A tiles are read straight from x's rows (32 k of up to 16
// rows, x's row stride). One TDPBF16PS is 16 rows x 16 columns x 32 k; the tiles are
//   tmm0-3  accumulators: 1 row tile x 4 panels (up to 16 rows), or 2 row tiles x 2 panels (32 rows)
//   tmm4-5  A: the row tiles' 32 k
//   tmm6-7  B: panels, loaded in turn
// so every B tile loaded feeds one or two TDPBF16PS and every A tile two or four.
//
// Each output element is one chain of TDPBF16PS over k = 0, 32, 64, ... in order from zero (the
// accumulator tile never leaves the unit inside the chain), then the bias is added in fp32 and the sum
// rounded to bf16 once (store_bf16x16: c10::BFloat16's rounding). A row of a tile is computed from that
// row of A alone, so neither the number of rows in the tile, nor the tile, the row block or the thread
// changes a row's result: a batch's rows equal the rows computed alone (batch invariance, SGLang's
// --enable-deterministic-inference). The chain differs from vdpbf16ps's (bf16_packed_avx512.h), so a
// process takes one of the two for a given weight shape whatever the rows (use_bf16_amx).
//
// Work split. Up to 16 rows (decode): every thread streams its panels front to back four at a time, one
// row tile (the weight is read once; the step is memory-bound). More rows: panels in pairs across threads;
// per thread its pairs in chunks of ~kAmxChunkBytes of weight (in L2), and per chunk every 32-row block
// of x over every pair (the chunk is read from L2 once per row block with non-temporal tile loads, the
// row block's A tiles from L1).
// A thread that finishes its share first takes the others' last units (work_stealing.h).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "amx_tiles.h"
#include "bf16_dot.h"
#include "bf16_packed_avx512.h"
#include "work_stealing.h"

#define RADIXLM_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace radixlm_gemm {

constexpr int64_t kAmxChunkBytes = 768 << 10;  // weight bytes per thread chunk (held in L2 over row blocks)

// Whether a bf16 weight of K input features in panels of pw columns is multiplied on AMX tiles here
// (pair panels, whole 32-k A tiles, a CPU and kernel that grant the tiles); fixed per process and shape.
inline bool use_bf16_amx(int64_t K, int64_t pw) {
  return use_bf16_pairs(K, pw) && K % 32 == 0 && radixlm_amx::bf16_usable();
}

// Loads the configuration for row tiles of r0 and r1 (0: one row tile) rows: accumulators and A tiles
// 64 bytes x their rows, B tiles 64 bytes x 16 pairs.
RADIXLM_AMX_TARGET inline void amx_gemm_configure(int64_t r0, int64_t r1) {
  radixlm_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
  const uint8_t a = static_cast<uint8_t>(r0), b = static_cast<uint8_t>(r1 > 0 ? r1 : r0);
  if (r1 > 0) {
    cfg.rows[0] = cfg.rows[1] = a;  // row tile 0 x panels 0, 1
    cfg.rows[2] = cfg.rows[3] = b;  // row tile 1 x panels 0, 1
  } else {
    cfg.rows[0] = cfg.rows[1] = cfg.rows[2] = cfg.rows[3] = a;  // row tile 0 x panels 0-3
  }
  cfg.rows[4] = a;
  cfg.rows[5] = b;
  cfg.rows[6] = cfg.rows[7] = 16;
  radixlm_amx::configure(cfg);
}

// Asks for the 16 lines of the B tile at b (1,024 contiguous bytes) into L1.
RADIXLM_AMX_TARGET inline void amx_prefetch_b(const at::BFloat16* b) {
  const char* p = reinterpret_cast<const char*>(b);
  for (int i = 0; i < 16; ++i) _mm_prefetch(p + 64 * i, _MM_HINT_T0);
}

constexpr int64_t kAmxAhead = 4;  // k steps (32 k each) ahead at which the tiles' lines are asked for

// Rounds `rows` rows of the fp32 block c (64 floats a row) over np panels, plus bias, into y (ldy).
RADIXLM_AMX_TARGET inline void amx_store_rows(const float* c, int64_t rows, int64_t np, at::BFloat16* y, int64_t ldy,
                                              const at::BFloat16* bias) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < np; ++p) {
      __m512 o = _mm512_loadu_ps(c + r * 64 + 16 * p);
      if (bias != nullptr) o = _mm512_add_ps(o, load16(bias + 16 * p));
      store_bf16x16(y + r * ldy + 16 * p, o);
    }
}

// One row tile (the configured rows, <= 16) x NP (1-4) panels at w (stride ps elements), K in 32-k
// steps: tiles 0..NP-1 accumulate, stored to c (64 floats a row).
template <int NP>
RADIXLM_AMX_TARGET inline void amx_row_tile(const at::BFloat16* x, int64_t ldx, const at::BFloat16* w, int64_t ps,
                                            int64_t K, float* c) {
  _tile_zero(0);
  if constexpr (NP > 1) _tile_zero(1);
  if constexpr (NP > 2) _tile_zero(2);
  if constexpr (NP > 3) _tile_zero(3);
  const int64_t sx = ldx * 2;
  for (int64_t k = 0; k < K; k += 32) {
    const at::BFloat16* b = w + k * 16;  // pair row k / 2 of panel 0: (k / 2) * 32 elements
    if (k + kAmxAhead * 32 < K) {
      const at::BFloat16* bf = b + kAmxAhead * 32 * 16;
      for (int p = 0; p < NP; ++p) amx_prefetch_b(bf + p * ps);
    }
    _tile_loadd(4, x + k, sx);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NP > 1) {
      _tile_loadd(7, b + ps, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (NP > 2) {
      _tile_loadd(6, b + 2 * ps, 64);
      _tile_dpbf16ps(2, 4, 6);
    }
    if constexpr (NP > 3) {
      _tile_loadd(7, b + 3 * ps, 64);
      _tile_dpbf16ps(3, 4, 7);
    }
  }
  _tile_stored(0, c, 256);
  if constexpr (NP > 1) _tile_stored(1, c + 16, 256);
  if constexpr (NP > 2) _tile_stored(2, c + 32, 256);
  if constexpr (NP > 3) _tile_stored(3, c + 48, 256);
}

// Two row tiles (16 rows, then the configured r1) x NP (1-2) panels: tiles 2 * t + p accumulate row tile
// t x panel p; stored to c (64 floats a row, 32 rows).
template <int NP>
RADIXLM_AMX_TARGET inline void amx_two_row_tiles(const at::BFloat16* x, int64_t ldx, const at::BFloat16* w, int64_t ps,
                                                 int64_t K, float* c) {
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (NP > 1) {
    _tile_zero(1);
    _tile_zero(3);
  }
  const int64_t sx = ldx * 2;
  const at::BFloat16* x1 = x + 16 * ldx;
  for (int64_t k = 0; k < K; k += 32) {
    const at::BFloat16* b = w + k * 16;
    // B tiles are each used once per row block: TILELOADDT1 (the non-temporal hint) reads them from
    // L2 without filling L1, so the row block's A tiles (32 rows x K, 36 KB at K = 576) stay in L1.
    // No software prefetch here: prefetching B into L1 brings the eviction back (measured, paired:
    // stream loads alone 0.98x the time of plain loads + prefetch, stream loads without prefetch
    // 0.85x at 512-1,024 rows, 0.95x at 128). Both B tiles, then A0's two products, then A1's: tile 4
    // is free for the next step's A0 after the second product and tile 6 after the third.
    _tile_loadd(4, x + k, sx);
    _tile_stream_loadd(6, b, 64);
    if constexpr (NP > 1) _tile_stream_loadd(7, b + ps, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NP > 1) _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, x1 + k, sx);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (NP > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 256);
  _tile_stored(2, c + 16 * 64, 256);
  if constexpr (NP > 1) {
    _tile_stored(1, c + 16, 256);
    _tile_stored(3, c + 16 * 64 + 16, 256);
  }
}

// Panels [p0, p1) for rows [m, m + rows) (rows <= 16), four at a time.
RADIXLM_AMX_TARGET inline void amx_panels_one_tile(const at::BFloat16* x, int64_t ldx, int64_t rows, const at::BFloat16* w,
                                                   int64_t ps, int64_t K, int64_t p0, int64_t p1, int64_t N,
                                                   const at::BFloat16* bias, at::BFloat16* y, float* c) {
  amx_gemm_configure(rows, 0);
  for (int64_t p = p0; p < p1;) {
    const int64_t np = std::min<int64_t>(4, p1 - p);
    const at::BFloat16* wp = w + p * ps;
    if (np == 4) amx_row_tile<4>(x, ldx, wp, ps, K, c);
    else if (np == 3) amx_row_tile<3>(x, ldx, wp, ps, K, c);
    else if (np == 2) amx_row_tile<2>(x, ldx, wp, ps, K, c);
    else amx_row_tile<1>(x, ldx, wp, ps, K, c);
    amx_store_rows(c, rows, np, y + p * 16, N, bias != nullptr ? bias + p * 16 : nullptr);
    p += np;
  }
}

// y (M, N) = x (M, K; row stride ldx, K % 32 == 0) W^T (+ bias) for W packed as (N / 16, K, 16) pair panels.
// Each thread starts on its own panels (as at::parallel_for would split them) and, when done, steals
// units from the back of the others' (work_stealing.h); a unit's outputs are the same whoever runs it.
inline void linear_pairs_bf16_amx(const at::BFloat16* x, int64_t ldx, int64_t M, const at::BFloat16* w, int64_t N,
                                  int64_t K, const at::BFloat16* bias, at::BFloat16* y) {
  const int64_t panels = N / 16, ps = K * 16;
  if (M <= 16) {  // units: 4 panels (one amx_row_tile<4> pass over the weight)
    const radixlm_parallel::Shares s((panels + 3) / 4);
    radixlm_parallel::parallel_steal(s.threads, [&](int64_t t) { return s.count(t); }, [&](int64_t, int64_t, auto&& run) {
      alignas(64) float c[16 * 64];
      run([&](int64_t t, int64_t u) {
        const int64_t p0 = 4 * (s.begin(t) + u);
        amx_panels_one_tile(x, ldx, M, w, ps, K, p0, std::min(p0 + 4, panels), N, bias, y, c);
      });
    });
    return;
  }
  // Units: (chunk of ~kAmxChunkBytes of weight, 32-row block), chunk-major so that a thread's chunk
  // stays in its L2 over the row blocks; a row block of up to 16 rows (the last) takes one row tile.
  const int64_t pairs = (panels + 1) / 2;
  const int64_t chunk = std::max<int64_t>(1, kAmxChunkBytes / (K * 64));  // panel pairs per chunk
  const int64_t blocks = (M + 31) / 32;
  const radixlm_parallel::Shares s(pairs);
  auto units = [&](int64_t t) { return (s.count(t) + chunk - 1) / chunk * blocks; };
  radixlm_parallel::parallel_steal(s.threads, units, [&](int64_t, int64_t, auto&& run) {
    alignas(64) float c[32 * 64];
    run([&](int64_t t, int64_t u) {
      const int64_t c0 = s.begin(t) + (u / blocks) * chunk;
      const int64_t q0 = 2 * c0, q1 = std::min(panels, 2 * std::min(s.end(t), c0 + chunk));  // panels of the chunk
      const int64_t m = (u % blocks) * 32;
      if (M - m <= 16) {
        amx_panels_one_tile(x + m * ldx, ldx, M - m, w, ps, K, q0, q1, N, bias, y + m * N, c);
        return;
      }
      const int64_t r1 = std::min<int64_t>(16, M - m - 16);  // 17-32 rows: two row tiles
      amx_gemm_configure(16, r1);
      const at::BFloat16* xm = x + m * ldx;
      for (int64_t p = q0; p < q1; p += 2) {
        const int64_t np = std::min<int64_t>(2, q1 - p);
        if (np == 2) amx_two_row_tiles<2>(xm, ldx, w + p * ps, ps, K, c);
        else amx_two_row_tiles<1>(xm, ldx, w + p * ps, ps, K, c);
        amx_store_rows(c, 16 + r1, np, y + m * N + p * 16, N, bias != nullptr ? bias + p * 16 : nullptr);
      }
    });
  });
}


}  // namespace radixlm_gemm
