// AVX512-BF16 engine of the pair tile path (pair_tile_attention.h), included by paged_attention.cpp
// inside its anonymous namespace after that header.
//
// On CPUs with AVX512-BF16 and no AMX (Zen 4 / 5, Cooper Lake) both products of a bf16 pool's
// attention run on VDPBF16PS (16 lanes x a pair of bf16 products into fp32):
// - S = Q K^T: a lane is a key, the chain runs over the key's pairs of dims in order (the
//   pair-transposed K block), the query's pair broadcast;
// - O += P V: a lane is an output dim, the chain runs over pairs of keys in order (V re-laid as pairs
//   of keys by pair_values), the query vector's pair of bf16 probabilities broadcast.
// Against the fp32 path's FMAs on widened V this halves the instructions of P V and reads V as bf16.
// Tiles of up to 4 (scores) / 6 (P V) query vectors x 64 keys / dims share each load; a query vector's
// results never depend on the tile it is in.

#ifdef CPU_CAPABILITY_AVX512

// Whether this process has VDPBF16PS (fixed per process).
inline bool avx512_bf16_usable() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

// s[q * BLOCK + jv + 16 v + lane] = q . k for NQ query vectors (pairs at q + q * half) and NV vectors of
// 16 keys from jv of the pair-transposed block kp.
template <int NQ, int NV>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void dp_scores_tile(
    const uint32_t* q, int64_t half, const uint32_t* kp, int64_t jv, float* s) {
  __m512 acc[NQ][NV];
  for (int i = 0; i < NQ; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < half; ++i) {
    const uint32_t* row = kp + i * BLOCK + jv;
    __m512bh k[NV];
    for (int v = 0; v < NV; ++v) k[v] = (__m512bh)_mm512_loadu_si512(row + v * 16);
    for (int x = 0; x < NQ; ++x) {
      const __m512bh qi = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[x * half + i]));
      for (int v = 0; v < NV; ++v) acc[x][v] = _mm512_dpbf16_ps(acc[x][v], qi, k[v]);
    }
  }
  for (int x = 0; x < NQ; ++x)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + x * BLOCK + jv + v * 16, acc[x][v]);
}

template <int NQ>
inline void dp_scores_rows(const uint32_t* q, int64_t half, const uint32_t* kp, int64_t ncols, float* s) {
  int64_t jv = 0;
  for (; jv + 64 <= ncols; jv += 64) dp_scores_tile<NQ, 4>(q, half, kp, jv, s);
  for (; jv + 32 <= ncols; jv += 32) dp_scores_tile<NQ, 2>(q, half, kp, jv, s);
  for (; jv < ncols; jv += 16) dp_scores_tile<NQ, 1>(q, half, kp, jv, s);
}

// acc[q * d + c0 + 16 v + lane] += sum over key pairs kp < pairs of p(q, 2kp) v_2kp + p(q, 2kp+1) v_2kp+1
// for NQ query vectors (bf16 probability pairs at p + q * BLOCK / 2) and NV vectors of 16 dims from c0.
template <int NQ, int NV>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void dp_accumulate_tile(
    const uint32_t* p, const uint32_t* vp, int64_t pairs, int64_t d, int64_t c0, float* acc) {
  __m512 a[NQ][NV];
  for (int x = 0; x < NQ; ++x)
    for (int v = 0; v < NV; ++v) a[x][v] = _mm512_loadu_ps(acc + x * d + c0 + v * 16);
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const uint32_t* row = vp + kp * d + c0;
    __m512bh y[NV];
    for (int v = 0; v < NV; ++v) y[v] = (__m512bh)_mm512_loadu_si512(row + v * 16);
    for (int x = 0; x < NQ; ++x) {
      const __m512bh px = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[x * (BLOCK / 2) + kp]));
      for (int v = 0; v < NV; ++v) a[x][v] = _mm512_dpbf16_ps(a[x][v], px, y[v]);
    }
  }
  for (int x = 0; x < NQ; ++x)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc + x * d + c0 + v * 16, a[x][v]);
}

template <int NQ>
inline void dp_accumulate_rows(const uint32_t* p, const uint32_t* vp, int64_t pairs, int64_t d, float* acc) {
  int64_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) dp_accumulate_tile<NQ, 4>(p, vp, pairs, d, c0, acc);
  for (; c0 + 32 <= d; c0 += 32) dp_accumulate_tile<NQ, 2>(p, vp, pairs, d, c0, acc);
  for (; c0 < d; c0 += 16) dp_accumulate_tile<NQ, 1>(p, vp, pairs, d, c0, acc);
}

// dp_accumulate_tile for dims [c0, c0 + 32 * NH) straight from the block's V rows (vrows[j] for j < n, zero
// rows past n): each pair of keys is interleaved in registers by key_pairs, as pair_values lays it out, so the
// products and their order are the same; for a few query vectors (a decode item) this saves writing
// and re-reading the block's pairs.
template <int NQ, int NH>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void dp_accumulate_raw_tile(
    const uint32_t* p, const at::BFloat16* const* vrows, int64_t n, int64_t pairs, int64_t d, int64_t c0, float* acc) {
  __m512 a[NQ][2 * NH];
  for (int x = 0; x < NQ; ++x)
    for (int v = 0; v < 2 * NH; ++v) a[x][v] = _mm512_loadu_ps(acc + x * d + c0 + v * 16);
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const at::BFloat16* r0 = value_row(vrows, n, 2 * kp);
    const at::BFloat16* r1 = value_row(vrows, n, 2 * kp + 1);
    __m512bh y[2 * NH];
    for (int h = 0; h < NH; ++h) {
      __m512i lo, hi;
      key_pairs(r0, r1, c0 + 32 * h, lo, hi);
      y[2 * h] = (__m512bh)lo;
      y[2 * h + 1] = (__m512bh)hi;
    }
    for (int x = 0; x < NQ; ++x) {
      const __m512bh px = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[x * (BLOCK / 2) + kp]));
      for (int v = 0; v < 2 * NH; ++v) a[x][v] = _mm512_dpbf16_ps(a[x][v], px, y[v]);
    }
  }
  for (int x = 0; x < NQ; ++x)
    for (int v = 0; v < 2 * NH; ++v) _mm512_storeu_ps(acc + x * d + c0 + v * 16, a[x][v]);
}

template <int NQ>
inline void dp_accumulate_raw_rows(const uint32_t* p, const at::BFloat16* const* vrows, int64_t n, int64_t pairs,
                                   int64_t d, float* acc) {
  int64_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) dp_accumulate_raw_tile<NQ, 2>(p, vrows, n, pairs, d, c0, acc);
  for (; c0 < d; c0 += 32) dp_accumulate_raw_tile<NQ, 1>(p, vrows, n, pairs, d, c0, acc);
}

// The AVX512-BF16 engine for attend_rows_tiles (no row padding, nothing to configure).
struct DpTiles {
  static constexpr int64_t kRowMultiple = 1;
  static int64_t padded(int64_t nq) { return nq; }
  static void begin(int64_t) {}
  // S (mpad, BLOCK) = Q (mpad, d) K^T over the block's keys [0, ncols) (a multiple of 16).
  static void scores(const at::BFloat16* q, const uint32_t* kp, int64_t mpad, int64_t ncols, int64_t d, float* s) {
    const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q);
    const int64_t half = d / 2;
    for (int64_t x = 0; x < mpad; x += 4) {
      const uint32_t* qx = q32 + x * half;
      float* sx = s + x * BLOCK;
      switch (std::min<int64_t>(4, mpad - x)) {
        case 4: dp_scores_rows<4>(qx, half, kp, ncols, sx); break;
        case 3: dp_scores_rows<3>(qx, half, kp, ncols, sx); break;
        case 2: dp_scores_rows<2>(qx, half, kp, ncols, sx); break;
        default: dp_scores_rows<1>(qx, half, kp, ncols, sx); break;
      }
    }
  }
  // Up to 6 query vectors (one register tile) read the V rows themselves; more share pair_values' block.
  static bool reads_value_rows(int64_t mpad) { return mpad <= 6; }
  // acc (mpad, d) += P (mpad, BLOCK) V over the block's keys [0, npad) (an even number; d a multiple of 32):
  // V from vp (pair_values' layout) or, with vp null, from the n rows vrows (zero rows past n).
  static void accumulate(const at::BFloat16* p, const uint32_t* vp, const at::BFloat16* const* vrows, int64_t n,
                         int64_t mpad, int64_t npad, int64_t d, float* acc) {
    const uint32_t* p32 = reinterpret_cast<const uint32_t*>(p);
    if (vp == nullptr) {
      switch (mpad) {
        case 6: return dp_accumulate_raw_rows<6>(p32, vrows, n, npad / 2, d, acc);
        case 5: return dp_accumulate_raw_rows<5>(p32, vrows, n, npad / 2, d, acc);
        case 4: return dp_accumulate_raw_rows<4>(p32, vrows, n, npad / 2, d, acc);
        case 3: return dp_accumulate_raw_rows<3>(p32, vrows, n, npad / 2, d, acc);
        case 2: return dp_accumulate_raw_rows<2>(p32, vrows, n, npad / 2, d, acc);
        default: return dp_accumulate_raw_rows<1>(p32, vrows, n, npad / 2, d, acc);
      }
    }
    for (int64_t x = 0; x < mpad; x += 6) {
      const uint32_t* px = p32 + x * (BLOCK / 2);
      float* ax = acc + x * d;
      switch (std::min<int64_t>(6, mpad - x)) {
        case 6: dp_accumulate_rows<6>(px, vp, npad / 2, d, ax); break;
        case 5: dp_accumulate_rows<5>(px, vp, npad / 2, d, ax); break;
        case 4: dp_accumulate_rows<4>(px, vp, npad / 2, d, ax); break;
        case 3: dp_accumulate_rows<3>(px, vp, npad / 2, d, ax); break;
        case 2: dp_accumulate_rows<2>(px, vp, npad / 2, d, ax); break;
        default: dp_accumulate_rows<1>(px, vp, npad / 2, d, ax); break;
      }
    }
  }
  static void release() {}
};
#endif

// Whether a bf16 pool with head_dim d runs on the AVX512-BF16 engine here (no AMX; d a multiple of 32,
// whole pair_values steps).
inline bool use_dp_attention(int64_t d) {
#ifdef CPU_CAPABILITY_AVX512
  return !use_amx_attention(d) && avx512_bf16_usable() && d % 32 == 0 && d <= 256;
#else
  (void)d;
  return false;
#endif
}
