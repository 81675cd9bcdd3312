// 8 x 8 fp32 transpose in AVX2 registers (the unpack / shuffle / permute sequence, 24 shuffles),
// shared by the attention kernel (K blocks -> keys in vector lanes) and the quantized panel GEMM
// (unpacked weight rows -> the packed panel layout). Values are moved, not computed.
#pragma once

#include <cstdint>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

namespace radixlm_gemm {

// dst[c * ld + i] = r[i][c] for i, c in 0..7.
inline void transpose8x8_store(const __m256 r[8], float* dst, int64_t ld) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ld, _mm256_permute2f128_ps(u[i], u[4 + i], 0x20));
    _mm256_storeu_ps(dst + (4 + i) * ld, _mm256_permute2f128_ps(u[i], u[4 + i], 0x31));
  }
}

}  // namespace radixlm_gemm
#endif
