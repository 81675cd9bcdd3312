// Linear layers over weights kept quantized (CPU): y = x W^T with W stored as blocks of 32 weights.
//
// Formats (one uint8 row of `row_bytes` per output feature; K = in_features, a multiple of 32):
//   0 int8  (per output channel, symmetric): fp32 scale s, then K int8 q;          w = s * q
//   1 Q8_0  (GGUF): K/32 blocks of {fp16 d, int8 q[32]} (34 bytes);                  w = d * q
//   2 Q4_0  (GGUF): K/32 blocks of {fp16 d, uint8 qs[16]} (18 bytes);                w = d * (q - 8)
//   3 Q4_1  (GGUF): K/32 blocks of {fp16 d, fp16 m, uint8 qs[16]} (20 bytes);         w = d * q + m
// In the 4-bit formats, weight j of a block is the low nibble of qs[j] and weight j + 16 the high one
// (ggml's layout), so GGUF tensors are used byte for byte.
//
// quant_linear(x, w, fmt, K): the decode kernel. Like llama.cpp's CPU path, each row of x (M, K) is
// first quantized to 8 bits per block of 32 (d_x = max|x| / 127, q_x = round-half-even(x / d_x), and
// s_x = d_x * sum(q_x) for the 4-bit formats' offset terms); a block's dot product is then exact in
// integers (AVX2 _mm256_maddubs_epi16 u8 x s8 pairs, _mm256_madd_epi16 to int32) and scaled once:
//   int8: s * sum_b d_x[b] * <q, q_x>_b          Q8_0: sum_b d[b] d_x[b] <q, q_x>_b
//   Q4_0: sum_b d[b] (d_x[b] <q, q_x>_b - 8 s_x[b])   Q4_1: sum_b d[b] d_x[b] <q, q_x>_b + m[b] s_x[b]
// Every weight block is read once per call and dotted with all M activation rows while it is in L1,
// so decode (small M) streams the compressed weights once. Threads (at::parallel_for, torch's OpenMP
// pool) split the output rows. The result equals dequantize(W) @ dequantize(quantize8(x))^T up to the
// order of fp32 additions; the error against the fp32 x is the 8-bit activation rounding.
//
// quant_dequantize(w, fmt, K): W as fp32 (N, K), rounded as gguf-py's numpy reference (d * q, then
// + m: no fused multiply-add), so it equals the fp32 weights radixlm converts a GGUF file to. Large
// M (prefill) multiplies with the fp32 GEMM on the dequantized weight (kernels/quant/gemm.py).
//
// AVX2 intrinsics where the build has them (CPU_CAPABILITY_AVX2 / _AVX512, with F16C for the fp16
// scales), else portable scalar code with the same integer arithmetic.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#define RADIXLM_QUANT_AVX2 1
#include <immintrin.h>
#endif

#include "../../gemm/cpu/microkernel.h"
#include "../../gemm/cpu/transpose.h"
#ifdef CPU_CAPABILITY_AVX512
#include "../../gemm/cpu/fp32_packed_avx512.h"
#include "quant_rows_avx512.h"
#include "quant_rows_bf16_avx512.h"
#endif

namespace {

constexpr int64_t QK = 32;  // weights per block
enum Fmt : int64_t { INT8 = 0, Q8_0 = 1, Q4_0 = 2, Q4_1 = 3 };

int64_t row_bytes(int64_t fmt, int64_t K) {
  switch (fmt) {
    case INT8: return 4 + K;
    case Q8_0: return K / QK * 34;
    case Q4_0: return K / QK * 18;
    case Q4_1: return K / QK * 20;
  }
  TORCH_CHECK(false, "unknown quantized format ", fmt, " (0 int8, 1 q8_0, 2 q4_0, 3 q4_1)");
}

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#ifdef RADIXLM_QUANT_AVX2
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

void check_weight(const at::Tensor& w, int64_t fmt, int64_t K) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous(),
              "quantized weight must be a contiguous CPU uint8 (out_features, row_bytes) tensor");
  TORCH_CHECK(K > 0 && K % QK == 0, "in_features ", K, " is not a multiple of the block size 32");
  TORCH_CHECK(w.size(1) == row_bytes(fmt, K), "quantized weight rows have ", w.size(1), " bytes, format ", fmt,
              " with in_features ", K, " needs ", row_bytes(fmt, K));
}

// ---------------------------------------------------------------------------------------------------
// Activations to 8 bits per block of 32: q (M, K) int8, d (M, K/32), s = d * sum(q) (M, K/32).

void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t nb = K / QK;
  at::parallel_for(0, M * nb, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xb = x + i * QK;  // row-major (M, K): block i of the flattened rows
      int8_t* qb = q + i * QK;
#ifdef RADIXLM_QUANT_AVX2
      const __m256 sign = _mm256_set1_ps(-0.0f);
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_loadu_ps(xb + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
      }
      __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float dv = _mm_cvtss_f32(m4) / 127.f;
      const float id = dv != 0.f ? 1.f / dv : 0.f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i iq[4];
      for (int j = 0; j < 4; ++j) {
        iq[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      // int32 -> int16 -> int8 (packs interleave 128-bit lanes; the permute restores the order)
      __m256i p01 = _mm256_packs_epi32(iq[0], iq[1]);
      __m256i p23 = _mm256_packs_epi32(iq[2], iq[3]);
      __m256i p = _mm256_packs_epi16(p01, p23);
      p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), p);
      __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(iq[0], iq[1]), _mm256_add_epi32(iq[2], iq[3]));
      __m128i s4 = _mm_add_epi32(_mm256_extracti128_si256(sum32, 1), _mm256_castsi256_si128(sum32));
      s4 = _mm_hadd_epi32(s4, s4);
      s4 = _mm_hadd_epi32(s4, s4);
      d[i] = dv;
      s[i] = dv * static_cast<float>(_mm_cvtsi128_si32(s4));
#else
      float amax = 0.f;
      for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float dv = amax / 127.f;
      const float id = dv != 0.f ? 1.f / dv : 0.f;
      int sum = 0;
      for (int j = 0; j < QK; ++j) {
        const int v = static_cast<int>(std::nearbyint(xb[j] * id));  // default rounding: half to even
        qb[j] = static_cast<int8_t>(v);
        sum += v;
      }
      d[i] = dv;
      s[i] = dv * static_cast<float>(sum);
#endif
    }
  });
}

// ---------------------------------------------------------------------------------------------------
// One weight block: its (up to) 32 quantized values and scales.

struct Block {
  const uint8_t* q;  // int8 q (INT8, Q8_0) or packed nibbles (Q4_0, Q4_1)
  float d;           // block scale (INT8: 1, the row scale is applied at the end)
  float m;           // Q4_1 offset; Q4_0: -8 * d
};

template <int64_t FMT>
inline Block block_at(const uint8_t* row, int64_t b) {
  if constexpr (FMT == INT8) {
    return {row + 4 + b * QK, 1.f, 0.f};
  } else if constexpr (FMT == Q8_0) {
    const uint8_t* p = row + b * 34;
    return {p + 2, half_to_float(p), 0.f};
  } else if constexpr (FMT == Q4_0) {
    const uint8_t* p = row + b * 18;
    const float d = half_to_float(p);
    return {p + 2, d, -8.f * d};
  } else {
    const uint8_t* p = row + b * 20;
    return {p + 4, half_to_float(p), half_to_float(p + 2)};
  }
}

constexpr bool is_q4(int64_t fmt) { return fmt == Q4_0 || fmt == Q4_1; }

#ifdef RADIXLM_QUANT_AVX2
// The decode kernels stream the weight rows (contiguous in memory) once; the hardware prefetcher alone
// leaves one thread at ~4.5 GB/s of Q4_1 and ~6.5 GB/s of Q8_0 on a Zen 3 that reads ~10 GB/s with
// torch's sum. A software prefetch of the bytes ~2.9 KB ahead of the block being read (some rows ahead)
// raises that to ~5-6 and ~9 GB/s through quant_linear (1 KB and 4 KB ahead did less). Prefetching
// past the end of the weight is harmless: a prefetch never faults.
constexpr int64_t kPrefetchBytes = 2880;

inline void prefetch_ahead(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The block's 32 weights as bytes: nibbles 0..15 (unsigned) for Q4, int8 for the 8-bit formats.
template <int64_t FMT>
inline __m256i load_weights(const uint8_t* q) {
  if constexpr (is_q4(FMT)) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(v, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    return _mm256_set_m128i(hi, lo);
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  }
}

// <w, x> of one block in int32 lanes.
template <int64_t FMT>
inline __m256i dot_block(__m256i w, __m256i x) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (is_q4(FMT)) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);  // w in [0, 15]: no saturation
  } else {
    // signed x signed: |w| (unsigned) times x with w's sign (llama.cpp's mul_sum_i8_pairs)
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), ones);
  }
}

// Output row n for activation rows [m0, m0 + MB).
template <int64_t FMT, int MB>
inline void row_dot(const uint8_t* row, int64_t nb, const int8_t* xq, const float* xd, const float* xs, int64_t K,
                    int64_t m0, float* out, int64_t ldo) {
  __m256 acc[MB];
  float off[MB];
  for (int j = 0; j < MB; ++j) {
    acc[j] = _mm256_setzero_ps();
    off[j] = 0.f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const Block blk = block_at<FMT>(row, b);
    prefetch_ahead(blk.q);
    const __m256i w = load_weights<FMT>(blk.q);
    for (int j = 0; j < MB; ++j) {
      const int64_t r = m0 + j;
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + b * QK));
      const __m256 p = _mm256_cvtepi32_ps(dot_block<FMT>(w, x));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(blk.d * xd[r * (K / QK) + b]), p, acc[j]);
      if constexpr (is_q4(FMT)) off[j] += blk.m * xs[r * (K / QK) + b];
    }
  }
  const float rs = FMT == INT8 ? load_f32(row) : 1.f;
  for (int j = 0; j < MB; ++j) out[(m0 + j) * ldo] = (hsum(acc[j]) + off[j]) * rs;
}
#else
template <int64_t FMT, int MB>
inline void row_dot(const uint8_t* row, int64_t nb, const int8_t* xq, const float* xd, const float* xs, int64_t K,
                    int64_t m0, float* out, int64_t ldo) {
  float acc[MB];
  for (int j = 0; j < MB; ++j) acc[j] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const Block blk = block_at<FMT>(row, b);
    int w[QK];
    for (int i = 0; i < QK; ++i) {
      if constexpr (is_q4(FMT)) {
        w[i] = i < 16 ? (blk.q[i] & 0x0F) : (blk.q[i - 16] >> 4);
      } else {
        w[i] = static_cast<int8_t>(blk.q[i]);
      }
    }
    for (int j = 0; j < MB; ++j) {
      const int64_t r = m0 + j;
      const int8_t* x = xq + r * K + b * QK;
      int32_t isum = 0;
      for (int i = 0; i < QK; ++i) isum += w[i] * x[i];
      acc[j] += blk.d * xd[r * (K / QK) + b] * static_cast<float>(isum);
      if constexpr (is_q4(FMT)) acc[j] += blk.m * xs[r * (K / QK) + b];
    }
  }
  const float rs = FMT == INT8 ? load_f32(row) : 1.f;
  for (int j = 0; j < MB; ++j) out[(m0 + j) * ldo] = acc[j] * rs;
}
#endif

// The fp32-activation variant: the block's weights unpacked to fp32 in registers (q, not yet scaled),
// dotted with fp32 x, then scaled once per block: d * <q, x>_b (+ m * sum(x_b) for Q4_1, - 8 d sum(x_b)
// for Q4_0); xs holds sum(x_b). No activation rounding: equals dequantize(W) @ x up to fp32 rounding.
#ifdef RADIXLM_QUANT_AVX2
template <int64_t FMT>
inline void load_weights_f32(const uint8_t* q, __m256 out[4]) {
  if constexpr (is_q4(FMT)) {
    // 8 packed bytes widen straight from memory to 8 dwords; each dword's low nibble (and) and high
    // nibble (shift) are weights j and j + 16: 4 widening loads' worth of work in 2 (ggml's layout).
    const __m256i mask = _mm256_set1_epi32(0x0F);
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
    out[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, mask));
    out[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, mask));
    out[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    out[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  } else {
    for (int j = 0; j < 4; ++j) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * j));
      out[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    }
  }
}

template <int64_t FMT, int MB>
inline void row_dot_f32(const uint8_t* row, int64_t nb, const float* x, const float* xs, int64_t K, int64_t m0,
                        float* out, int64_t ldo) {
  __m256 acc[MB];
  float off[MB];
  for (int j = 0; j < MB; ++j) {
    acc[j] = _mm256_setzero_ps();
    off[j] = 0.f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const Block blk = block_at<FMT>(row, b);
    prefetch_ahead(blk.q);
    __m256 w[4];
    load_weights_f32<FMT>(blk.q, w);
    const __m256 d = _mm256_set1_ps(blk.d);
    for (int j = 0; j < MB; ++j) {
      const float* xb = x + (m0 + j) * K + b * QK;
      __m256 p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
      p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), p);
      p = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), p);
      p = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), p);
      acc[j] = _mm256_fmadd_ps(d, p, acc[j]);
      if constexpr (is_q4(FMT)) off[j] += blk.m * xs[(m0 + j) * nb + b];
    }
  }
  const float rs = FMT == INT8 ? load_f32(row) : 1.f;
  for (int j = 0; j < MB; ++j) out[(m0 + j) * ldo] = (hsum(acc[j]) + off[j]) * rs;
}
#else
template <int64_t FMT, int MB>
inline void row_dot_f32(const uint8_t* row, int64_t nb, const float* x, const float* xs, int64_t K, int64_t m0,
                        float* out, int64_t ldo) {
  float acc[MB];
  for (int j = 0; j < MB; ++j) acc[j] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const Block blk = block_at<FMT>(row, b);
    float w[QK];
    for (int i = 0; i < QK; ++i) {
      if constexpr (is_q4(FMT)) {
        w[i] = static_cast<float>(i < 16 ? (blk.q[i] & 0x0F) : (blk.q[i - 16] >> 4));
      } else {
        w[i] = static_cast<float>(static_cast<int8_t>(blk.q[i]));
      }
    }
    for (int j = 0; j < MB; ++j) {
      const float* xb = x + (m0 + j) * K + b * QK;
      float p = 0.f;
      for (int i = 0; i < QK; ++i) p += w[i] * xb[i];
      acc[j] += blk.d * p;
      if constexpr (is_q4(FMT)) acc[j] += blk.m * xs[(m0 + j) * nb + b];
    }
  }
  const float rs = FMT == INT8 ? load_f32(row) : 1.f;
  for (int j = 0; j < MB; ++j) out[(m0 + j) * ldo] = acc[j] * rs;
}
#endif

constexpr int MAX_MB = 4;  // activation rows per pass over a weight row (accumulators in registers)

template <int64_t FMT>
void gemm_rows_f32(const uint8_t* w, int64_t rb, int64_t N, int64_t K, int64_t M, const float* x, const float* xs,
                   float* out) {
  const int64_t nb = K / QK;
  const int64_t grain = std::max<int64_t>(1, 4096 / (nb * std::max<int64_t>(M, 1)));
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = w + n * rb;
      int64_t m0 = 0;
      for (; m0 + MAX_MB <= M; m0 += MAX_MB) row_dot_f32<FMT, MAX_MB>(row, nb, x, xs, K, m0, out + n, N);
      switch (M - m0) {
        case 3: row_dot_f32<FMT, 3>(row, nb, x, xs, K, m0, out + n, N); break;
        case 2: row_dot_f32<FMT, 2>(row, nb, x, xs, K, m0, out + n, N); break;
        case 1: row_dot_f32<FMT, 1>(row, nb, x, xs, K, m0, out + n, N); break;
        default: break;
      }
    }
  });
}

template <int64_t FMT>
void gemm_rows(const uint8_t* w, int64_t rb, int64_t N, int64_t K, int64_t M, const int8_t* xq, const float* xd,
               const float* xs, float* out) {
  const int64_t nb = K / QK;
  const int64_t grain = std::max<int64_t>(1, 4096 / (nb * std::max<int64_t>(M, 1)));
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = w + n * rb;
      int64_t m0 = 0;
      for (; m0 + MAX_MB <= M; m0 += MAX_MB) row_dot<FMT, MAX_MB>(row, nb, xq, xd, xs, K, m0, out + n, N);
      switch (M - m0) {
        case 3: row_dot<FMT, 3>(row, nb, xq, xd, xs, K, m0, out + n, N); break;
        case 2: row_dot<FMT, 2>(row, nb, xq, xd, xs, K, m0, out + n, N); break;
        case 1: row_dot<FMT, 1>(row, nb, xq, xd, xs, K, m0, out + n, N); break;
        default: break;
      }
    }
  });
}

// bf16 x: Q4_0 / Q4_1 on a CPU with AVX512-BF16 run quant_rows_bf16_avx512.h on x as it is, and Q8_0
// there runs the 256-bit rows on x widened to fp32 (exact), for every M: a row's result then does not
// depend on the batch (kernels/quant/gemm.py sends such calls here whatever M). Any other format or
// CPU computes on x widened to fp32 with the fp32 op below and rounds y to bf16.
at::Tensor quant_linear_fp32(const at::Tensor& x, const at::Tensor& w, int64_t fmt, int64_t K, bool int8_activations);

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t fmt, int64_t K, bool int8_activations) {
  check_weight(w, fmt, K);
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.dim() == 2 && x.size(1) == K,
              "quant_linear: x must be a CPU float32 or bfloat16 (M, ", K, ") tensor, got ", x.sizes(), " ",
              x.scalar_type());
  if (x.scalar_type() == at::kFloat) return quant_linear_fp32(x, w, fmt, K, int8_activations);
#ifdef CPU_CAPABILITY_AVX512
  if ((fmt == Q4_0 || fmt == Q4_1) && !int8_activations && radixlm_quant_rows::quant_rows_bf16_supported()) {
    using radixlm_quant_rows::Kind;
    const at::Tensor xc = x.contiguous();
    const int64_t M = xc.size(0), N = w.size(0);
    at::Tensor out = at::empty({M, N}, xc.options());
    if (M == 0 || N == 0) return out;
    const auto* xp = xc.data_ptr<at::BFloat16>();
    auto* op = out.data_ptr<at::BFloat16>();
    if (fmt == Q4_1) radixlm_quant_rows::quant_rows_bf16<Kind::Q4_1>(w.data_ptr<uint8_t>(), w.size(1), N, K, M, xp, op);
    else radixlm_quant_rows::quant_rows_bf16<Kind::Q4_0>(w.data_ptr<uint8_t>(), w.size(1), N, K, M, xp, op);
    return out;
  }
  if (fmt == Q8_0 && !int8_activations && radixlm_quant_rows::quant_rows_bf16_supported()) {
    // the 256-bit rows (gemm_rows_f32): faster than the 512-bit ones for one row (the LM head at
    // batch 1: 1.6-1.7 vs 1.9-2.4 ms on a Zen 4), as fast at 32 rows
    const at::Tensor xf = x.to(at::kFloat).contiguous();
    const int64_t M = xf.size(0), N = w.size(0);
    at::Tensor out = at::empty({M, N}, xf.options());
    if (M > 0 && N > 0)  // no block sums: only the 4-bit formats read them
      gemm_rows_f32<Q8_0>(w.data_ptr<uint8_t>(), w.size(1), N, K, M, xf.data_ptr<float>(), nullptr,
                          out.data_ptr<float>());
    return out.to(at::kBFloat16);
  }
#endif
  return quant_linear_fp32(x.to(at::kFloat), w, fmt, K, int8_activations).to(at::kBFloat16);
}

at::Tensor quant_linear_fp32(const at::Tensor& x, const at::Tensor& w, int64_t fmt, int64_t K, bool int8_activations) {
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), N = w.size(0), nb = K / QK;
  at::Tensor out = at::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return out;
  if (!int8_activations) {
    const float* xp = xc.data_ptr<float>();
#ifdef CPU_CAPABILITY_AVX512
    // The GGUF formats at 512-bit width (quant_rows_avx512.h); one row of Q8_0 runs faster below.
    if (fmt == Q4_0 || fmt == Q4_1 || (fmt == Q8_0 && M > 1)) {
      using radixlm_quant_rows::Kind;
      using radixlm_quant_rows::quant_rows;
      const uint8_t* wp = w.data_ptr<uint8_t>();
      float* op = out.data_ptr<float>();
      if (fmt == Q4_1) quant_rows<Kind::Q4_1>(wp, w.size(1), N, K, M, xp, op);
      else if (fmt == Q4_0) quant_rows<Kind::Q4_0>(wp, w.size(1), N, K, M, xp, op);
      else quant_rows<Kind::Q8_0>(wp, w.size(1), N, K, M, xp, op);
      return out;
    }
#endif
    std::vector<float> xs(M * nb);  // sum of each block of x (the 4-bit formats' offset terms)
    for (int64_t i = 0; i < M * nb; ++i) {
      float t = 0.f;
      for (int64_t j = 0; j < QK; ++j) t += xp[i * QK + j];
      xs[i] = t;
    }
    const uint8_t* wp = w.data_ptr<uint8_t>();
    float* op = out.data_ptr<float>();
    switch (fmt) {
      case INT8: gemm_rows_f32<INT8>(wp, w.size(1), N, K, M, xp, xs.data(), op); break;
      case Q8_0: gemm_rows_f32<Q8_0>(wp, w.size(1), N, K, M, xp, xs.data(), op); break;
      case Q4_0: gemm_rows_f32<Q4_0>(wp, w.size(1), N, K, M, xp, xs.data(), op); break;
      case Q4_1: gemm_rows_f32<Q4_1>(wp, w.size(1), N, K, M, xp, xs.data(), op); break;
    }
    return out;
  }
  std::vector<int8_t> xq(M * K);
  std::vector<float> xd(M * nb), xs(M * nb);
  quantize_rows_q8(xc.data_ptr<float>(), M, K, xq.data(), xd.data(), xs.data());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t rb = w.size(1);
  float* op = out.data_ptr<float>();
  switch (fmt) {
    case INT8: gemm_rows<INT8>(wp, rb, N, K, M, xq.data(), xd.data(), xs.data(), op); break;
    case Q8_0: gemm_rows<Q8_0>(wp, rb, N, K, M, xq.data(), xd.data(), xs.data(), op); break;
    case Q4_0: gemm_rows<Q4_0>(wp, rb, N, K, M, xq.data(), xd.data(), xs.data(), op); break;
    case Q4_1: gemm_rows<Q4_1>(wp, rb, N, K, M, xq.data(), xd.data(), xs.data(), op); break;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------

template <int64_t FMT>
void dequantize_row(const uint8_t* row, int64_t K, float* out) {
  const int64_t nb = K / QK;
  const float rs = FMT == INT8 ? load_f32(row) : 1.f;
  for (int64_t b = 0; b < nb; ++b) {
    const Block blk = block_at<FMT>(row, b);
    float* o = out + b * QK;
    if constexpr (FMT == INT8) {
      for (int i = 0; i < QK; ++i) o[i] = rs * static_cast<float>(static_cast<int8_t>(blk.q[i]));
    } else if constexpr (FMT == Q8_0) {
      for (int i = 0; i < QK; ++i) o[i] = static_cast<float>(static_cast<int8_t>(blk.q[i])) * blk.d;
    } else if constexpr (FMT == Q4_0) {
      for (int i = 0; i < 16; ++i) {
        o[i] = blk.d * static_cast<float>((blk.q[i] & 0x0F) - 8);
        o[i + 16] = blk.d * static_cast<float>((blk.q[i] >> 4) - 8);
      }
    } else {
      for (int i = 0; i < 16; ++i) {
        o[i] = blk.d * static_cast<float>(blk.q[i] & 0x0F) + blk.m;
        o[i + 16] = blk.d * static_cast<float>(blk.q[i] >> 4) + blk.m;
      }
    }
  }
}

at::Tensor quant_dequantize(const at::Tensor& w, int64_t fmt, int64_t K) {
  check_weight(w, fmt, K);
  const int64_t N = w.size(0), rb = w.size(1);
  at::Tensor out = at::empty({N, K}, w.options().dtype(at::kFloat));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, std::max<int64_t>(1, 16384 / K), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      switch (fmt) {
        case INT8: dequantize_row<INT8>(wp + n * rb, K, op + n * K); break;
        case Q8_0: dequantize_row<Q8_0>(wp + n * rb, K, op + n * K); break;
        case Q4_0: dequantize_row<Q4_0>(wp + n * rb, K, op + n * K); break;
        case Q4_1: dequantize_row<Q4_1>(wp + n * rb, K, op + n * K); break;
      }
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------
// quant_linear_panels(x, w, fmt, K, bias?): the batched kernel (prefill, large decode batches). Each
// thread takes panels of PW output features (kernels/gemm/cpu/microkernel.h), unpacks the panel's
// rows with dequantize_row into fp32 scratch (K x PW, k-major: the packed GEMM's panel layout) and
// runs the fp32 register-blocked microkernel over all M rows of x with it. The weights are read in
// their compressed form, once per call; the arithmetic is the fp32 GEMM's, so the result is bitwise
// linear_packed(x, pack_linear_weight(quant_dequantize(w))) (+ bias), whatever M or the thread.

// (pw, K) rows -> (K, pw) panel.
inline void transpose_rows_to_panel(const float* rows, int64_t pw, int64_t K, float* panel) {
#ifdef RADIXLM_QUANT_AVX2
  if (pw % 8 == 0 && K % 8 == 0) {
    for (int64_t j0 = 0; j0 < pw; j0 += 8) {
      for (int64_t k0 = 0; k0 < K; k0 += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + (j0 + i) * K + k0);
        radixlm_gemm::transpose8x8_store(r, panel + k0 * pw + j0, pw);
      }
    }
    return;
  }
#endif
  for (int64_t j = 0; j < pw; ++j)
    for (int64_t k = 0; k < K; ++k) panel[k * pw + j] = rows[j * K + k];
}

// dequantize_row with AVX2: the same products and sums (d * q, then + m; no fused multiply-add), so
// the same floats, 8 at a time.
template <int64_t FMT>
void dequantize_row_vec(const uint8_t* row, int64_t K, float* out) {
#ifdef RADIXLM_QUANT_AVX2
  const int64_t nb = K / QK;
  const __m256 rs = _mm256_set1_ps(FMT == INT8 ? load_f32(row) : 1.f);
  for (int64_t b = 0; b < nb; ++b) {
    const Block blk = block_at<FMT>(row, b);
    float* o = out + b * QK;
    if constexpr (FMT == INT8 || FMT == Q8_0) {
      const __m256 d = FMT == INT8 ? rs : _mm256_set1_ps(blk.d);
      for (int i = 0; i < QK; i += 8) {
        const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.q + i));
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
        _mm256_storeu_ps(o + i, FMT == INT8 ? _mm256_mul_ps(d, q) : _mm256_mul_ps(q, d));
      }
    } else {
      const __m256 d = _mm256_set1_ps(blk.d), m = _mm256_set1_ps(blk.m), eight = _mm256_set1_ps(8.f);
      const __m256i lo_mask = _mm256_set1_epi32(0x0F);
      for (int i = 0; i < 16; i += 8) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.q + i)));
        __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, lo_mask));
        __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
        if constexpr (FMT == Q4_0) {  // d * (q - 8): the subtraction is exact in floats
          lo = _mm256_mul_ps(d, _mm256_sub_ps(lo, eight));
          hi = _mm256_mul_ps(d, _mm256_sub_ps(hi, eight));
        } else {
          lo = _mm256_add_ps(_mm256_mul_ps(d, lo), m);
          hi = _mm256_add_ps(_mm256_mul_ps(d, hi), m);
        }
        _mm256_storeu_ps(o + i, lo);
        _mm256_storeu_ps(o + 16 + i, hi);
      }
    }
  }
#else
  dequantize_row<FMT>(row, K, out);
#endif
}

template <int64_t FMT>
void linear_panels_impl(const float* xp, int64_t ldx, int64_t M, const uint8_t* wp, int64_t rb, int64_t N, int64_t K,
                        const float* bp, float* yp) {
  const int64_t pw = radixlm_gemm::panel_width(N), panels = N / pw;
#ifdef CPU_CAPABILITY_AVX512
  if (pw == 16) {  // fp32_packed_avx512.h's tiles on groups of 3 dequantized panels: the same chains
    using namespace radixlm_gemm;
    const int64_t groups = (panels + kPackedPanels - 1) / kPackedPanels, ps = K * 16;
    const auto xpk = scratch(M * K);  // all rows packed once: each group's panels pass over every row
    const int64_t row_block = packed_row_block(K);
    for (int64_t m0 = 0; m0 < M; m0 += row_block) pack_block(xp, ldx, m0, std::min(M, m0 + row_block), K, xpk.get() + m0 * K);
    at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
      const auto rows = scratch(16 * K), group = scratch(kPackedPanels * ps);
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t p = g * kPackedPanels, np = std::min<int64_t>(kPackedPanels, panels - p);
        for (int64_t i = 0; i < np; ++i) {
          for (int64_t j = 0; j < 16; ++j) dequantize_row_vec<FMT>(wp + ((p + i) * 16 + j) * rb, K, rows.get() + j * K);
          transpose_rows_to_panel(rows.get(), 16, K, group.get() + i * ps);
        }
        for (int64_t m0 = 0; m0 < M; m0 += row_block)
          packed_group(xpk.get() + m0 * K, m0, std::min(M, m0 + row_block), K, group.get(), ps, np, yp + m0 * N + p * 16,
                       N, bp != nullptr ? bp + p * 16 : nullptr, nullptr, 0);
      }
    });
    return;
  }
#endif
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> rows(pw * K), panel(K * pw);
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t j = 0; j < pw; ++j) dequantize_row_vec<FMT>(wp + (p * pw + j) * rb, K, rows.data() + j * K);
      transpose_rows_to_panel(rows.data(), pw, K, panel.data());
      for (int64_t m0 = 0; m0 < M; m0 += radixlm_gemm::kRowBlock)
        radixlm_gemm::panel_rows<float>(xp, ldx, m0, std::min(M, m0 + radixlm_gemm::kRowBlock), panel.data(), pw, K,
                                        yp + p * pw, N, bp != nullptr ? bp + p * pw : nullptr);
    }
  });
}

at::Tensor quant_linear_panels(const at::Tensor& x, const at::Tensor& w, int64_t fmt, int64_t K,
                               const c10::optional<at::Tensor>& bias) {
  check_weight(w, fmt, K);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) == K,
              "quant_linear_panels: x must be a float32 (M, ", K, ") tensor");
  const int64_t M = x.size(0), N = w.size(0);
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == at::kFloat && bias->is_contiguous(),
                "quant_linear_panels: bias must be a contiguous float32 (", N, ",) tensor");
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t rb = w.size(1), ldx = xc.stride(0);
  switch (fmt) {
    case INT8: linear_panels_impl<INT8>(xp, ldx, M, wp, rb, N, K, bp, y.data_ptr<float>()); break;
    case Q8_0: linear_panels_impl<Q8_0>(xp, ldx, M, wp, rb, N, K, bp, y.data_ptr<float>()); break;
    case Q4_0: linear_panels_impl<Q4_0>(xp, ldx, M, wp, rb, N, K, bp, y.data_ptr<float>()); break;
    case Q4_1: linear_panels_impl<Q4_1>(xp, ldx, M, wp, rb, N, K, bp, y.data_ptr<float>()); break;
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("quant_linear(Tensor x, Tensor w, int fmt, int in_features, bool int8_activations) -> Tensor");
  m.def("quant_dequantize(Tensor w, int fmt, int in_features) -> Tensor");
  m.def("quant_linear_panels(Tensor x, Tensor w, int fmt, int in_features, Tensor? bias) -> Tensor");
  m.impl("quant_linear", c10::DispatchKey::CPU, &quant_linear);
  m.impl("quant_dequantize", c10::DispatchKey::CPU, &quant_dequantize);
  m.impl("quant_linear_panels", c10::DispatchKey::CPU, &quant_linear_panels);
}
