// The 4-bit GGUF decode kernel for bf16 activations on AVX512-BF16 (vdpbf16ps; AMD Zen 4 / 5, Intel
// Cooper Lake / Sapphire Rapids): y = x W^T for bf16 x (any number of rows M) over Q4_0 / Q4_1 rows,
// y bf16. The weights stay 4-bit in memory and become bf16 in registers with no arithmetic: a nibble q
// as the 16-bit word 0x4300 | q is the bf16 number 128 + q (exponent 2^7, q in the 7 mantissa bits),
// so a block's 32 weights are an `and` and two byte interleaves (vpunpck{l,h}bw with the byte 0x43)
// away from vdpbf16ps operands, two blocks a register pair. The dot product of a block is then
//   dot_b = sum_i (128 + q_i) x_i = <q, x>_b + 128 s_b,   s_b = sum_i x_i   (fp32 sums of bf16 x),
// and Q4_1's w = d q + m (Q4_0's w = d (q - 8)) gives, per block,
//   <w, x>_b = d_b dot_b + c_b s_b,   c_b = m_b - 128 d_b   (Q4_0: c_b = -136 d_b).
// The d_b dot_b terms accumulate lane-wise (a two-block vector scaled by its lanes' d), the c_b s_b
// terms 16 blocks at a time, and one horizontal sum ends a row; the result is rounded to bf16 once
// (round-to-nearest-even). It equals dequantize(W) @ x (x as given, in bf16) up to fp32 rounding: the
// products are exact (8-bit by 8-bit significands), and the 128 s_b offset, cancelled in fp32, costs a
// few of fp32's 24 bits, far below the bf16 output's 8.
//
// Per two blocks and weight row this is 2 loads, a shift, an `and`, 3 shuffles (an insert, two
// interleaves), and per activation row 2 vdpbf16ps and one FMA, where the fp32-activation kernel
// (quant_rows_avx512.h) spends a table build, a widening and 2 cross-lane lookups per block, and the
// bf16 model would convert x to fp32 and y back around every linear. The activations are packed once
// per call into the interleaved order of those weight registers (pack_x_pairs).
//
// Compiled for AVX-512 builds; carries target("avx512bf16") and runs only where the CPU reports the
// feature (quant_rows_bf16_supported).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "quant_rows_avx512.h"

#define RADIXLM_QBF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace radixlm_quant_rows {

inline bool quant_rows_bf16_supported() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

// x rows (M, K) bf16 bits -> xp (M, nbp, 64) words and s (M, nb) fp32, nbp = ceil(nb / 2) block pairs.
// Pair p of row j holds blocks b = 2p and b + 1 in the order the weight registers unpack them:
//   xp[..., 0:32]  = x_b[0:8],  x_b1[0:8],  x_b[16:24], x_b1[16:24]   (vpunpcklbw's)
//   xp[..., 32:64] = x_b[8:16], x_b1[8:16], x_b[24:32], x_b1[24:32]   (vpunpckhbw's)
// (x_b1 zeros past the last block); s[j, b] = sum of block b's 32 values in fp32, in order.
inline void pack_x_pairs(const uint16_t* x, int64_t M, int64_t K, uint16_t* xp, float* s) {
  const int64_t nb = K / kQK, nbp = (nb + 1) / 2;
  for (int64_t j = 0; j < M; ++j) {
    const uint16_t* xr = x + j * K;
    for (int64_t b = 0; b < nb; ++b) {
      float t = 0.f;
      for (int64_t i = 0; i < kQK; ++i) t += static_cast<float>(c10::BFloat16(xr[b * kQK + i], c10::BFloat16::from_bits()));
      s[j * nb + b] = t;
    }
    for (int64_t p = 0; p < nbp; ++p) {
      uint16_t* o = xp + (j * nbp + p) * 64;
      const uint16_t* x0 = xr + 2 * p * kQK;
      const bool has1 = 2 * p + 1 < nb;
      for (int half = 0; half < 2; ++half) {      // 0: the unpacklo register, 1: unpackhi's
        for (int c = 0; c < 4; ++c) {             // 128-bit chunk: b lo, b1 lo, b hi, b1 hi
          const int64_t blk = c & 1, base = (c >> 1) * 16 + half * 8;
          for (int i = 0; i < 8; ++i)
            o[half * 32 + c * 8 + i] = blk == 0 ? x0[base + i] : (has1 ? x0[kQK + base + i] : uint16_t{0});
        }
      }
    }
  }
}

// NR consecutive output rows (weight rows row0, row0 + rb, ...) for MB activation rows.
template <Kind F, int NR, int MB>
RADIXLM_QBF16_TARGET inline void rows_tile_bf16(const uint8_t* row0, int64_t rb, int64_t nb, const uint16_t* xp,
                                                const float* s, float* out, int64_t ldo, const uint8_t* pf,
                                                int64_t pf_lines) {
  static_assert(F == Kind::Q4_0 || F == Kind::Q4_1, "4-bit formats only");
  constexpr int64_t kB = block_bytes(F), kQOff = F == Kind::Q4_1 ? 4 : 2;
  constexpr bool kXRegs = MB <= 4;
  const int64_t nbp = (nb + 1) / 2;
  const __m512i low4 = _mm512_set1_epi8(0x0F), exp128 = _mm512_set1_epi8(0x43);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  __m512 acc[NR][MB];
  alignas(64) float cacc[NR][MB][16] = {};  // the c_b s_b terms: touched once per 16 blocks, so in memory
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MB; ++j) acc[r][j] = _mm512_setzero_ps();
  alignas(64) float dm[NR][32];
  // pf's lines (the rows some groups on) are asked for a few per block pair, spread over the tile
  const int64_t pf_step = (pf_lines + nbp - 1) / nbp;
  int64_t pf_next = 0;
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int64_t nc = std::min<int64_t>(16, nb - b0);
    const __mmask16 live = static_cast<__mmask16>((1u << nc) - 1);
    for (int r = 0; r < NR; ++r) {
      block_scales<F>(row0 + r * rb + b0 * kB, nc, dm[r]);
      // c_b for the window's blocks: m - 128 d (Q4_1) or -136 d (Q4_0)
      const __m512 lo = _mm512_load_ps(dm[r]), hi = _mm512_load_ps(dm[r] + 16);
      const __m512 d = _mm512_permutex2var_ps(lo, even, hi);
      __m512 c;
      if constexpr (F == Kind::Q4_1) {
        const __m512 m = _mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi);
        c = _mm512_fnmadd_ps(_mm512_set1_ps(128.f), d, m);
      } else {
        c = _mm512_mul_ps(_mm512_set1_ps(-136.f), d);
      }
      for (int j = 0; j < MB; ++j)
        _mm512_store_ps(cacc[r][j], _mm512_fmadd_ps(c, _mm512_maskz_loadu_ps(live, s + j * nb + b0),
                                                     _mm512_load_ps(cacc[r][j])));
    }
    for (int64_t i = 0; i < nc; i += 2) {
      const int64_t b = b0 + i, p = b / 2;
      const bool pair = i + 1 < nc;  // nc is even except at the row's end
      for (const int64_t stop = std::min(pf_next + pf_step, pf_lines); pf_next < stop; ++pf_next)
        _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * pf_next), _MM_HINT_T0);
      // up to 4 rows of x stay in registers for the pair; 8 rows are read from L1 per weight row
      __m512bh xl[kXRegs ? MB : 1], xh[kXRegs ? MB : 1];
      if constexpr (kXRegs) {
        for (int j = 0; j < MB; ++j) {
          xl[j] = (__m512bh)_mm512_loadu_si512(xp + (j * nbp + p) * 64);
          xh[j] = (__m512bh)_mm512_loadu_si512(xp + (j * nbp + p) * 64 + 32);
        }
      }
      for (int r = 0; r < NR; ++r) {
        const uint8_t* q = row0 + r * rb + b * kB + kQOff;
        const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
        const __m128i q1 = pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + kB)) : _mm_setzero_si128();
        const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
        const __m512i z = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), low4);
        const __m512bh wl = (__m512bh)_mm512_unpacklo_epi8(z, exp128);
        const __m512bh wh = (__m512bh)_mm512_unpackhi_epi8(z, exp128);
        // lanes 0-3 and 8-11 hold block b, lanes 4-7 and 12-15 block b + 1
        const __m512 scale = _mm512_mask_mov_ps(_mm512_set1_ps(dm[r][2 * i]), 0xF0F0,
                                                _mm512_set1_ps(pair ? dm[r][2 * i + 2] : 0.f));
        for (int j = 0; j < MB; ++j) {
          const __m512bh xlj = kXRegs ? xl[j] : (__m512bh)_mm512_loadu_si512(xp + (j * nbp + p) * 64);
          const __m512bh xhj = kXRegs ? xh[j] : (__m512bh)_mm512_loadu_si512(xp + (j * nbp + p) * 64 + 32);
          const __m512 dot = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), wl, xlj), wh, xhj);
          acc[r][j] = _mm512_fmadd_ps(scale, dot, acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MB; ++j)
      out[j * ldo + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][j], _mm512_load_ps(cacc[r][j])));
}

// All M activation rows against one group of NR weight rows (rows: the group's first row), in passes
// of 8 (then 4, then the rest) while the group's bytes stay in L1; the pf lines are asked for during
// the first pass.
template <Kind F, int NR>
inline void group_rows_bf16(const uint8_t* rows, int64_t rb, int64_t nb, int64_t M, const uint16_t* xp,
                            const float* s, float* out, int64_t N, const uint8_t* pf, int64_t pf_lines) {
  const int64_t nbp = (nb + 1) / 2;
  int64_t m = 0;
  for (; m + 8 <= M; m += 8)
    rows_tile_bf16<F, NR, 8>(rows, rb, nb, xp + m * nbp * 64, s + m * nb, out + m * N, N, pf, m == 0 ? pf_lines : 0);
  if (m + 4 <= M) {
    rows_tile_bf16<F, NR, 4>(rows, rb, nb, xp + m * nbp * 64, s + m * nb, out + m * N, N, pf, m == 0 ? pf_lines : 0);
    m += 4;
  }
  const uint16_t* xq = xp + m * nbp * 64;
  const float* sq = s + m * nb;
  float* oq = out + m * N;
  const int64_t pl = m == 0 ? pf_lines : 0;
  switch (M - m) {
    case 3: rows_tile_bf16<F, NR, 3>(rows, rb, nb, xq, sq, oq, N, pf, pl); break;
    case 2: rows_tile_bf16<F, NR, 2>(rows, rb, nb, xq, sq, oq, N, pf, pl); break;
    case 1: rows_tile_bf16<F, NR, 1>(rows, rb, nb, xq, sq, oq, N, pf, pl); break;
    default: break;
  }
}

// All N output rows for all M activation rows (fp32 out (M, N)): threads split the weight row groups
// (4 rows a group for one activation row, 2 for more: up to 16 accumulators).
template <Kind F>
inline void rows_all_bf16(const uint8_t* w, int64_t rb, int64_t N, int64_t nb, int64_t M, const uint16_t* xp,
                          const float* s, float* out) {
  const int64_t nbp = (nb + 1) / 2;
  auto run = [&](auto nr, int64_t m0, int64_t mc) {  // activation rows [m0, m0 + mc) against all N
    constexpr int NR = decltype(nr)::value;
    const uint16_t* xq = xp + m0 * nbp * 64;
    const float* sq = s + m0 * nb;
    float* oq = out + m0 * N;
    for_row_groups<NR>(
        w, rb, N, std::max<int64_t>(1, 2048 / (nb * NR * mc)),
        [&](const uint8_t* rows, int64_t n0, const uint8_t* pf, int64_t pf_lines) {
          group_rows_bf16<F, NR>(rows, rb, nb, mc, xq, sq, oq + n0, N, pf, pf_lines);
        },
        [&](int64_t n) { group_rows_bf16<F, 1>(w + n * rb, rb, nb, mc, xq, sq, oq + n, N, w, 0); });
  };
  if (M == 1) return run(std::integral_constant<int, 4>{}, 0, 1);
  if (M <= 32) return run(std::integral_constant<int, 2>{}, 0, M);  // decode batches: weights read once
  // Many rows (prefill): 8 at a time over all the weight rows, so those 8 rows of x (18 KB at K = 576)
  // stay in L1 while the weight (a few hundred KB to 1 MB of blocks) comes from L2 / L3 once per 8
  // rows, instead of x streaming from L2 once per group of 2 weight rows (4096-row prefill in process:
  // 329-428 -> 447-499 tok/s on a Zen 4). Same chains per row either way.
  for (int64_t m0 = 0; m0 < M; m0 += 8) run(std::integral_constant<int, 2>{}, m0, std::min<int64_t>(8, M - m0));
}

// n fp32 -> bf16, rounded to nearest even (vcvtneps2bf16; NaN stays NaN).
RADIXLM_QBF16_TARGET inline void round_to_bf16(const float* in, int64_t n, c10::BFloat16* y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(in + i)));
  for (; i < n; ++i) y[i] = c10::BFloat16(in[i]);
}

// y (M, N) bf16 = x (M, K) bf16 W^T, any M: each output is the same chain of operations whatever M
// (its own accumulators, in block order), so a row's result does not depend on the batch. Call only
// where quant_rows_bf16_supported().
template <Kind F>
void quant_rows_bf16(const uint8_t* w, int64_t rb, int64_t N, int64_t K, int64_t M, const c10::BFloat16* x,
                     c10::BFloat16* y) {
  const int64_t nb = K / kQK, nbp = (nb + 1) / 2;
  // every element is written before it is read: no zero fill (6 MB of y for a 512-token prefill)
  std::unique_ptr<uint16_t[]> xp(new uint16_t[M * nbp * 64]);
  std::unique_ptr<float[]> s(new float[M * nb]), out(new float[M * N]);
  pack_x_pairs(reinterpret_cast<const uint16_t*>(x), M, K, xp.get(), s.get());
  rows_all_bf16<F>(w, rb, N, nb, M, xp.get(), s.get(), out.get());
  round_to_bf16(out.get(), M * N, y);
}

}  // namespace radixlm_quant_rows
