// The GGUF decode kernel at 512-bit width (AVX-512F): y = x W^T for a few rows of fp32 x (M <= 8)
// over Q4_0 / Q4_1 / Q8_0 rows, each weight dequantized exactly as quant_dequantize does (Q4_1: d * q,
// rounded, then + m; Q4_0: d * (q - 8); Q8_0: d * q) and dotted with fp32 x: the result is
// dequantize(W) @ x up to the order of the fp32 additions (16 lanes per half block, summed at the end).
//
// Q8_0: a block's 32 int8 widen to two vectors of fp32, times d. 4-bit formats: a block's 16 possible weight values go into one register as a table (T[j] = d * j + m), and the
// block's 32 nibbles become 32 table lookups: the 16 packed bytes widen to 16 dwords
// (vpmovzxbd), whose low 4 bits index T for weights 0..15 (vpermps reads only those bits) and, shifted
// right by 4, for weights 16..31 (ggml's nibble layout). So one block costs a widen, a shift, two
// lookups and, per activation row, two FMAs: no int-to-float conversion, no mask, no per-block scale.
// NR output rows run interleaved (independent FMA chains hide the FMA latency); threads
// (at::parallel_for) split the output rows, and each thread prefetches the rows PF_GROUPS groups
// ahead of the ones it computes into L1 (a decode step streams all the weights from memory once; the
// hardware prefetcher alone left the whole-model step at 8.6-9.8 ms, with it 5.7-6.2 ms, Q4_1, M = 1,
// 2 threads, AMX Xeon), a few lines per block.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace radixlm_quant_rows {

enum class Kind { Q4_0, Q4_1, Q8_0 };

constexpr int64_t kQK = 32;

constexpr int64_t block_bytes(Kind f) { return f == Kind::Q4_1 ? 20 : f == Kind::Q4_0 ? 18 : 34; }

// The fp16 scales of n (<= 16) consecutive blocks from blk, as fp32: dm[2i] = block i's d and, for
// Q4_1, dm[2i + 1] = its m (block i's first 32 bits: d, then m or the first quant bytes). The 16
// blocks' bytes come in as 128-byte windows (two 64-byte loads, masked past the n blocks: a masked-off
// byte is never read), and one two-table permute a window picks the first dword (Q4_1's 20-byte
// blocks: vpermt2d) or first two words (Q4_0, Q8_0: vpermt2w) of the blocks it covers; two widenings
// make them fp32, and the blocks then read their scales with broadcast loads. Converting each block's
// scales on its own took 4 shuffle-port ops a block, the port the table lookups need too; a vpgatherdd
// of the 16 dwords is microcoded where the Gather Data Sampling mitigation is on (an Ice Lake Xeon:
// Q4_1 rows in L1, one core, 8.0-8.6 -> 10.8-15.3 G weights/s without the gather).
template <Kind F>
struct ScaleWindows {
  static constexpr int64_t kB = block_bytes(F);
  static constexpr bool kDwords = kB % 4 == 0;                      // permute dwords, else 16-bit words
  static constexpr int64_t kUnit = kDwords ? 4 : 2;                 // bytes a permuted element
  static constexpr int64_t kLanes = kDwords ? 16 : 32;              // elements a register
  static constexpr int64_t kCount = (kB * 15 + 4 + 127) / 128;      // windows over the 16 blocks' first 4 bytes
  alignas(64) int32_t idx[kCount][16];                              // int16 lanes packed in pairs when !kDwords
  uint32_t mask[kCount];
  constexpr ScaleWindows() : idx{}, mask{} {
    for (int64_t w = 0; w < kCount; ++w) {
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        // lane takes element (byte kB * block + kUnit * part) of window w, if the window holds it
        const int64_t block = kDwords ? lane : lane / 2, part = kDwords ? 0 : lane % 2;
        const int64_t e = (kB * block + kUnit * part) / kUnit - 128 / kUnit * w;
        if (e < 0 || e >= 128 / kUnit) continue;
        mask[w] |= 1u << lane;
        if (kDwords) idx[w][lane] = static_cast<int32_t>(e);
        else idx[w][lane / 2] |= static_cast<int32_t>(e << (16 * (lane % 2)));
      }
    }
  }
};

template <Kind F>
inline void block_scales(const uint8_t* blk, int64_t n, float* dm) {
  using W = ScaleWindows<F>;
  static constexpr W windows{};
  const int64_t bytes = n * W::kB;
  auto load = [&](int64_t off) {  // 64 bytes from blk + off; zeros past the n blocks
    if (off + 64 <= bytes) return _mm512_loadu_si512(blk + off);
    const int64_t left = bytes - off;
    return _mm512_maskz_loadu_epi8(left <= 0 ? __mmask64{0} : (__mmask64{1} << left) - 1, blk + off);
  };
  __m512i g = _mm512_setzero_si512();
  for (int64_t w = 0; w < W::kCount; ++w) {
    const __m512i lo = load(128 * w), hi = load(128 * w + 64), idx = _mm512_load_si512(windows.idx[w]);
    if constexpr (W::kDwords)
      g = _mm512_mask_mov_epi32(g, static_cast<__mmask16>(windows.mask[w]), _mm512_permutex2var_epi32(lo, idx, hi));
    else
      g = _mm512_mask_mov_epi16(g, windows.mask[w], _mm512_permutex2var_epi16(lo, idx, hi));
  }
  _mm512_store_ps(dm, _mm512_cvtph_ps(_mm512_castsi512_si256(g)));
  _mm512_store_ps(dm + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(g, 1)));
}

// The block's table of its 16 weight values (dm: its d, m), rounded as the reference dequantization.
template <Kind F>
inline __m512 block_table(const float* dm) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 d = _mm512_set1_ps(dm[0]);
  if constexpr (F == Kind::Q4_1) {
    return _mm512_add_ps(_mm512_mul_ps(d, iota), _mm512_set1_ps(dm[1]));
  } else {
    return _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.f)));
  }
}

// The block's 32 weights as fp32 (dm: its scales from block_scales): wl = weights 0..15, wh = 16..31.
template <Kind F>
inline void block_weights(const uint8_t* blk, const float* dm, __m512& wl, __m512& wh) {
  if constexpr (F == Kind::Q8_0) {
    const __m512 d = _mm512_set1_ps(dm[0]);
    const __m128i* q = reinterpret_cast<const __m128i*>(blk + 2);
    wl = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
    wh = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
  } else {
    const __m512 t = block_table<F>(dm);
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (F == Kind::Q4_1 ? 4 : 2))));
    wl = _mm512_permutexvar_ps(e, t);
    wh = _mm512_permutexvar_ps(_mm512_srli_epi32(e, 4), t);
  }
}

// NR consecutive output rows (weight rows row0, row0 + rb, ...) for MB activation rows of x (ldx = K).
template <Kind F, int NR, int MB>
inline void rows_tile(const uint8_t* row0, int64_t rb, int64_t nb, const float* x, int64_t K, float* out,
                      int64_t ldo, const uint8_t* pf, int64_t pf_lines) {
  constexpr int64_t kBlockBytes = block_bytes(F);
  __m512 lo[NR][MB], hi[NR][MB];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MB; ++j) lo[r][j] = hi[r][j] = _mm512_setzero_ps();
  alignas(64) float dm[NR][32];
  const int64_t pf_step = (pf_lines + nb - 1) / nb;  // pf's lines, a few per block (see rows_mb)
  int64_t pf_next = 0;
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int64_t nc = std::min<int64_t>(16, nb - b0);
    for (int r = 0; r < NR; ++r) block_scales<F>(row0 + r * rb + b0 * kBlockBytes, nc, dm[r]);
    for (int64_t i = 0; i < nc; ++i) {
      const int64_t b = b0 + i;
      for (const int64_t stop = std::min(pf_next + pf_step, pf_lines); pf_next < stop; ++pf_next)
        _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * pf_next), _MM_HINT_T0);
      __m512 xl[MB], xh[MB];
      for (int j = 0; j < MB; ++j) {
        xl[j] = _mm512_loadu_ps(x + j * K + b * kQK);
        xh[j] = _mm512_loadu_ps(x + j * K + b * kQK + 16);
      }
      for (int r = 0; r < NR; ++r) {
        __m512 wl, wh;
        block_weights<F>(row0 + r * rb + b * kBlockBytes, dm[r] + 2 * i, wl, wh);
        for (int j = 0; j < MB; ++j) {
          lo[r][j] = _mm512_fmadd_ps(wl, xl[j], lo[r][j]);
          hi[r][j] = _mm512_fmadd_ps(wh, xh[j], hi[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MB; ++j) out[j * ldo + r] = _mm512_reduce_add_ps(_mm512_add_ps(lo[r][j], hi[r][j]));
}

// Row groups ahead that a tile prefetches, its lines spread over the tile's blocks; each thread first
// asks for its range's first PF_GROUPS groups at once. (One burst of a group's lines per group and
// none for a range's first groups left the demo's 1536-wide down projection at ~10 GB/s; spread, a
// bf16 step's 4-bit linears took ~20 % less time on a Zen 4, quant_rows_bf16_avx512.h.)
constexpr int64_t PF_GROUPS = 4;

// tile(rows, n0, pf, pf_lines) for each group of NR consecutive weight rows (rows = row n0's bytes),
// the groups split over threads (at::parallel_for, grain groups at least); pf / pf_lines: the lines a
// tile is to prefetch (the group PF_GROUPS on, none near the end of a thread's range), and each
// thread first asks for its range's first groups. Then tail(n) for the last N % NR rows.
template <int NR, class Tile, class Tail>
inline void for_row_groups(const uint8_t* w, int64_t rb, int64_t N, int64_t grain, const Tile& tile, const Tail& tail) {
  const int64_t groups = N / NR, group_lines = (NR * rb + 63) / 64;
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    const uint8_t* first = w + begin * NR * rb;
    for (int64_t l = 0; l < std::min(PF_GROUPS, end - begin) * group_lines; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(first + 64 * l), _MM_HINT_T0);
    for (int64_t g = begin; g < end; ++g) {
      const bool ahead = g + PF_GROUPS < end;
      tile(w + g * NR * rb, g * NR, ahead ? w + (g + PF_GROUPS) * NR * rb : w, ahead ? group_lines : 0);
    }
  });
  for (int64_t n = groups * NR; n < N; ++n) tail(n);
}

// All N output rows for MB activation rows.
template <Kind F, int MB>
inline void rows_mb(const uint8_t* w, int64_t rb, int64_t N, int64_t nb, const float* x, int64_t K, float* out,
                    int64_t ldo) {
  constexpr int NR = MB <= 2 ? 4 : 2;
  for_row_groups<NR>(
      w, rb, N, std::max<int64_t>(1, 2048 / (nb * NR * MB)),
      [&](const uint8_t* rows, int64_t n0, const uint8_t* pf, int64_t pf_lines) {
        rows_tile<F, NR, MB>(rows, rb, nb, x, K, out + n0, ldo, pf, pf_lines);
      },
      [&](int64_t n) { rows_tile<F, 1, MB>(w + n * rb, rb, nb, x, K, out + n, ldo, w, 0); });
}

// y (M, N) = x (M, K) W^T; M rows in passes of up to 4.
template <Kind F>
void quant_rows(const uint8_t* w, int64_t rb, int64_t N, int64_t K, int64_t M, const float* x, float* out) {
  const int64_t nb = K / kQK;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) rows_mb<F, 4>(w, rb, N, nb, x + m * K, K, out + m * N, N);
  switch (M - m) {
    case 3: rows_mb<F, 3>(w, rb, N, nb, x + m * K, K, out + m * N, N); break;
    case 2: rows_mb<F, 2>(w, rb, N, nb, x + m * K, K, out + m * N, N); break;
    case 1: rows_mb<F, 1>(w, rb, N, nb, x + m * K, K, out + m * N, N); break;
    default: break;
  }
}

}  // namespace radixlm_quant_rows
