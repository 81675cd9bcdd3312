// The register-blocked GEMM microkernel over panel-packed weights (BLIS / GotoBLAS scheme: Goto & van
// de Geijn 2008; Van Zee & van de Geijn 2015), shared by the fp32/bf16 linear (gemm.cpp) and the
// quantized-weight linear that unpacks a panel at a time (quant/cpu/quant_gemm.cpp).
//
// A panel is PW (16, or 8, 4, 2, 1) output columns of a weight, k-major: panel[k * PW + j] = w[j, k].
// `tile(rows, x, ldx, panel, pw, K, y, ldy, bias)` computes rows (<= kTileRows) rows of y = x W^T (+ bias)
// for the panel's columns: R x 16 accumulators in 12 AVX2 registers (with AVX-512: R <= 12 rows in
// 12 zmm registers; 8-wide panels: 6; narrower
// ones the same chains in scalar code), each output one FMA chain over k = 0 .. K-1 in order, the
// bias added after the chain. Where a row sits (tile, batch, thread) never changes its result.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "work_stealing.h"

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#define RADIXLM_GEMM_AVX2 1
#endif

namespace radixlm_gemm {

#ifdef CPU_CAPABILITY_AVX512
constexpr int64_t kTileRows = 12;  // rows per microkernel tile: 12 zmm accumulators of a 16-wide panel
#else
constexpr int64_t kTileRows = 6;  // rows per microkernel tile: 12 ymm accumulators (6 rows x 2 halves)
#endif
constexpr int64_t kRowBlock = 96;  // rows of x per pass over the panels

inline float widen(float v) { return v; }
inline float widen(at::BFloat16 v) { return static_cast<float>(v); }

// Panel width of an (N, K) weight: 16 output columns where N allows, else 8, 4, 2 or 1.
inline int64_t panel_width(int64_t n) {
  for (int64_t pw : {16, 8, 4, 2}) if (n % pw == 0) return pw;
  return 1;
}

template <typename T>
inline void store_row(T* y, const float* acc, const T* bias, int64_t pw) {
  for (int64_t j = 0; j < pw; ++j) {
    const float v = bias != nullptr ? acc[j] + widen(bias[j]) : acc[j];
    y[j] = static_cast<T>(v);
  }
}

// Any panel width, scalar: the same FMA chains as the vector tiles (so results are identical).
template <int R, typename T>
inline void micro_tile_scalar(const T* x, int64_t ldx, const T* panel, int64_t pw, int64_t K, T* y, int64_t ldy,
                              const T* bias) {
  float acc[R][16] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < pw; ++j) acc[r][j] = std::fma(widen(x[r * ldx + k]), widen(panel[k * pw + j]), acc[r][j]);
  for (int r = 0; r < R; ++r) store_row(y + r * ldy, acc[r], bias, pw);
}

#ifdef RADIXLM_GEMM_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {  // 8 bf16 -> 8 fp32 (exact: shift into the high half)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// R rows x V*8 columns in R*V registers (V = 2: 16-wide panels, V = 1: 8-wide).
template <int R, int V, typename T>
inline void micro_tile(const T* x, int64_t ldx, const T* panel, int64_t K, T* y, int64_t ldy, const T* bias) {
  constexpr int64_t PW = 8 * V;
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 b[V];
    for (int v = 0; v < V; ++v) b[v] = load8(panel + k * PW + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_set1_ps(widen(x[r * ldx + k]));
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      for (int v = 0; v < V; ++v) {
        __m256 o = acc[r][v];
        if (bias != nullptr) o = _mm256_add_ps(o, _mm256_loadu_ps(bias + 8 * v));
        _mm256_storeu_ps(y + r * ldy + 8 * v, o);
      }
    } else {
      alignas(32) float tmp[PW];
      for (int v = 0; v < V; ++v) _mm256_store_ps(tmp + 8 * v, acc[r][v]);
      store_row(y + r * ldy, tmp, bias, PW);
    }
  }
}
#endif

#ifdef CPU_CAPABILITY_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {  // 16 bf16 -> 16 fp32 (exact)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// R rows x a 16-wide panel in R zmm registers: the same FMA chains as micro_tile (x[m, k] * w + acc
// for k in order), so results are bitwise those of the 256-bit and scalar tiles.
template <int R, typename T>
inline void micro_tile16_avx512(const T* x, int64_t ldx, const T* panel, int64_t K, T* y, int64_t ldy, const T* bias) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b = load16(panel + k * 16);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(widen(x[r * ldx + k])), b, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      __m512 o = acc[r];
      if (bias != nullptr) o = _mm512_add_ps(o, _mm512_loadu_ps(bias));
      _mm512_storeu_ps(y + r * ldy, o);
    } else {
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, acc[r]);
      store_row(y + r * ldy, tmp, bias, 16);
    }
  }
}
#endif

template <int R, typename T>
inline void tile_rows(const T* x, int64_t ldx, const T* panel, int64_t pw, int64_t K, T* y, int64_t ldy,
                      const T* bias) {
#ifdef CPU_CAPABILITY_AVX512
  // Under 4 rows the 256-bit tile keeps more FMA chains in flight (2 per row); same results.
  if (pw == 16 && R >= 4) return micro_tile16_avx512<R>(x, ldx, panel, K, y, ldy, bias);
#endif
#ifdef RADIXLM_GEMM_AVX2
  if (pw == 16) return micro_tile<R, 2>(x, ldx, panel, K, y, ldy, bias);
  if (pw == 8) return micro_tile<R, 1>(x, ldx, panel, K, y, ldy, bias);
#endif
  micro_tile_scalar<R>(x, ldx, panel, pw, K, y, ldy, bias);
}

// Calls f(std::integral_constant<int, R>{}) with R = rows (1 <= rows <= MaxR): a runtime tile height
// to the compile-time one the tiles are unrolled for.
template <int MaxR, typename F>
inline void with_rows(int64_t rows, F&& f) {
  if constexpr (MaxR > 1) {
    if (rows < MaxR) return with_rows<MaxR - 1>(rows, f);
  }
  f(std::integral_constant<int, MaxR>{});
}

// Rows [m0, m1) split into tiles of near-equal height <= MaxR (32 rows at 6: 6+6+5+5+5+5, not 6x5+2: a
// short tile is load-bound); f(std::integral_constant<int, R>{}, first row) per tile.
template <int MaxR, typename F>
inline void near_equal_tiles(int64_t m0, int64_t m1, F&& f) {
  const int64_t rows = m1 - m0, tiles = (rows + MaxR - 1) / MaxR;
  for (int64_t t = 0, m = m0; t < tiles; ++t) {
    const int64_t h = rows / tiles + (t < rows % tiles ? 1 : 0);
    with_rows<MaxR>(h, [&](auto r) { f(r, m); });
    m += h;
  }
}

// The tiles near_equal_tiles<MaxR> makes of rows [m0, m1), spread over threads (units of `grain`
// tiles, work_stealing.h): for work per tile that writes only its own tile's output,
// e.g. packing a block of x (a prefill's is ~1 MB: one thread packing it left the other idle).
template <int MaxR, typename F>
inline void parallel_near_equal_tiles(int64_t m0, int64_t m1, int64_t grain, F&& f) {
  const int64_t rows = m1 - m0, tiles = (rows + MaxR - 1) / MaxR;
  if (tiles == 0) return;
  const int64_t base = rows / tiles, extra = rows % tiles;
  radixlm_parallel::parallel_for_steal(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = m0 + t * base + std::min(t, extra);
      with_rows<MaxR>(base + (t < extra ? 1 : 0), [&](auto r) { f(r, m); });
    }
  });
}

template <typename T>
inline void tile(int64_t rows, const T* x, int64_t ldx, const T* panel, int64_t pw, int64_t K, T* y, int64_t ldy,
                 const T* bias) {
  with_rows<kTileRows>(rows, [&](auto r) { tile_rows<decltype(r)::value>(x, ldx, panel, pw, K, y, ldy, bias); });
}

// Rows [m0, m1) of x times one panel into y's columns (y already offset to the panel's first column).
// next (or null): the panel this thread reads after this one (next_bytes long), fetched into L2 a
// slice before each tile, so that it streams from memory while this panel's tiles compute instead of
// stalling the next panel's first tile (with one pass over the weights, i.e. up to kRowBlock rows, every
// panel comes from memory once; hints only: no effect on results).
template <typename T>
inline void panel_rows(const T* x, int64_t ldx, int64_t m0, int64_t m1, const T* panel, int64_t pw, int64_t K, T* y,
                       int64_t ldy, const T* bias, const T* next = nullptr, int64_t next_bytes = 0) {
  const int64_t tiles = (m1 - m0 + kTileRows - 1) / kTileRows;
  const int64_t lines = next != nullptr && tiles > 1 ? (next_bytes + 63) / 64 : 0, per_tile = (lines + tiles - 1) / tiles;
  int64_t line = 0;
  near_equal_tiles<kTileRows>(m0, m1, [&](auto r, int64_t m) {
    for (const int64_t end = std::min(lines, line + per_tile); line < end; ++line)
      __builtin_prefetch(reinterpret_cast<const char*>(next) + 64 * line, 0, 2);
    tile_rows<decltype(r)::value>(x + m * ldx, ldx, panel, pw, K, y + m * ldy, ldy, bias);
  });
}

}  // namespace radixlm_gemm
