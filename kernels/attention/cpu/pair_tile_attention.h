// The pair tile path of the CPU paged attention (included by paged_attention.cpp inside its anonymous
// namespace, after the block loaders and the online-softmax helpers it uses): a bf16 pool's attention
// with both matrix products on bf16 pairs, as FlashAttention does on tensor cores (Dao et al. 2022).
// Per key block, S = Q K^T over the pair-transposed K block (load_block_pairs: dims 2i, 2i + 1 of a
// key in one 32-bit lane), the online softmax in fp32 with base-2 exponentials (exp2_ps), then
// O += P V with P rounded to bf16 (round to nearest even) and V re-laid as pairs of keys (pair_values).
// The normaliser sums the fp32 probabilities, as FlashAttention's does; torch's CPU flash attention
// also rounds P to the input dtype for its P V product.
//
// The two products come from a `Tiles` engine, chosen once per process:
// - AmxTiles (amx_attention.h): AMX-BF16 tiles, TDPBF16PS (Sapphire Rapids and later);
// - DpTiles (dpbf16_attention.h): AVX512-BF16 VDPBF16PS (Zen 4 / 5, Cooper Lake).
// Each gives every query vector's scores and output from its own row of Q and P only, with the key
// blocks (multiples of BLOCK) and the steps over them the same wherever a row is computed (pad keys
// get p = 0 and zero V rows, which add exact zeros), so a token's output stays bitwise the same in a
// prefill, a chunk, a decode step, any batch and the cascade pass.

#ifdef CPU_CAPABILITY_AVX512

// Per-thread buffers of the pair tile path, sized for up to `vectors` query vectors (Q / P / S / acc
// rows padded to a multiple of `row_multiple`: AMX tiles are 16 rows).
struct TileScratch {
  int64_t mpad = 0, d = 0;
  std::vector<at::BFloat16> q, p;  // (mpad, d) queries; (mpad, BLOCK) probabilities
  std::vector<float> s, acc, m, l; // (mpad, BLOCK) scores; (mpad, d) output accumulators; (mpad,) state
  std::vector<uint32_t> kp, vp;    // (d / 2, BLOCK) K pairs of dims; (BLOCK / 2, d) V pairs of keys
  std::vector<float> unused;       // load_block_pairs' fp32 V block (this path reads the pool's rows)
  TileScratch(int64_t vectors, int64_t d, int64_t row_multiple)
      : mpad((vectors + row_multiple - 1) / row_multiple * row_multiple), d(d), q(mpad * d), p(mpad * BLOCK),
        s(mpad * BLOCK), acc(mpad * d), m(mpad), l(mpad), kp(d / 2 * BLOCK), vp(BLOCK / 2 * d) {}
};

// This thread's TileScratch for at least `vectors` query vectors of head_dim d, kept between calls (an
// OpenMP thread lives as long as the pool): a fresh one per call zeroed up to ~0.5 MB per thread per
// layer. Nothing is read before this call writes it, except pad query rows, whose results no row reads.
inline TileScratch& tile_scratch(int64_t vectors, int64_t d, int64_t row_multiple) {
  static thread_local std::unique_ptr<TileScratch> sc;
  const int64_t mpad = (vectors + row_multiple - 1) / row_multiple * row_multiple;
  if (!sc || sc->d != d || sc->mpad < mpad) sc = std::make_unique<TileScratch>(vectors, d, row_multiple);
  return *sc;
}

// V row j of a key block of n rows (vrows), a zero row past n (pad keys add exact zeros).
inline const at::BFloat16* value_row(const at::BFloat16* const* vrows, int64_t n, int64_t j) {
  static thread_local at::BFloat16 zeros[256] = {};
  return j < n ? vrows[j] : zeros;
}

// Dims [c, c + 32) of two keys' V rows r0, r1 as pairs of keys: lo = (r0[c + i], r1[c + i]) for i < 16,
// hi the same for i = 16..31 (32-bit lanes). The one layout of V pairs in the pair tile path.
__attribute__((target("avx512f,avx512bw"))) inline void key_pairs(const at::BFloat16* r0, const at::BFloat16* r1,
                                                                  int64_t c, __m512i& lo, __m512i& hi) {
  alignas(64) static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                  8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                  24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i a = _mm512_loadu_si512(r0 + c), b = _mm512_loadu_si512(r1 + c);
  lo = _mm512_permutex2var_epi16(a, _mm512_load_si512(lo_idx), b);
  hi = _mm512_permutex2var_epi16(a, _mm512_load_si512(hi_idx), b);
}

// vp[kp * d + c] = the pair (v_{2kp}[c], v_{2kp+1}[c]) for the block's keys (zero rows past n), up to
// an even number of keys padded to whole 32-key steps.
__attribute__((target("avx512f,avx512bw"))) inline void pair_values(const at::BFloat16* const* vrows, int64_t n,
                                                                    int64_t npad, int64_t d, uint32_t* vp) {
  for (int64_t kp = 0; kp < npad / 2; ++kp) {
    const at::BFloat16* r0 = value_row(vrows, n, 2 * kp);
    const at::BFloat16* r1 = value_row(vrows, n, 2 * kp + 1);
    uint32_t* dst = vp + kp * d;
    for (int64_t c = 0; c < d; c += 32) {
      __m512i lo, hi;
      key_pairs(r0, r1, c, lo, hi);
      _mm512_storeu_si512(dst + c, lo);
      _mm512_storeu_si512(dst + c + 16, hi);
    }
  }
}

// The softmax of the pair tile path in two passes over a query vector's n raw scores q.k (the fp32
// path makes four): block_max (paged_attention.cpp) takes their maximum, nothing written back; exp_to_bf16
// writes p = bf16(2^(s c - m)) (zero up to npad), with c = scaling * log2(e) and m the running maximum
// in the same base-2, scaled units (m = c max s: scaling > 0, so the maximum commutes with it), and
// returns the fp32 sum. The scaling is folded into the exponent's single FMA, so the scores are read
// twice and written never. exp2 is radixlm_math::exp2_ps (elementwise/cpu/exp2_avx512.h: ~1 ulp, far
// below the bf16 rounding of p that follows; about half the instructions of Sleef's u10 expf, which the
// other paths use).
__attribute__((target("avx512f,avx512bf16,avx512vl"))) inline float exp_to_bf16(const float* s, float c, float m,
                                                                               int64_t n, int64_t npad,
                                                                               at::BFloat16* p) {
  const __m512 vc = _mm512_set1_ps(c), vm = _mm512_set1_ps(-m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < npad; j += 16) {
    const __mmask16 k = n - j >= 16 ? 0xFFFF : n > j ? static_cast<__mmask16>((1u << (n - j)) - 1) : 0;
    const __m512 e = _mm512_maskz_mov_ps(k, radixlm_math::exp2_ps(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, s + j), vc, vm)));
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh(e));
  }
  return _mm512_reduce_add_ps(sum);
}

// Attention of R query rows over keys [k0, k1) of KV head h (k0 a multiple of BLOCK), continuing the
// online-softmax state in sc.m / sc.l / sc.acc (query vector r * G + g): row r sees keys [0, lens[r]).
// On this path m is kept in base-2 units of the scaled scores (scaling * log2(e) * max q.k; the cascade
// state it hands over is only ever continued by this path in the same call). sc.q holds the rows'
// query vectors (filled by the caller). Tiles: the two products (AmxTiles / DpTiles).
template <typename Tiles>
inline void attend_rows_tiles(int64_t rows, const int64_t* lens, int64_t group, int64_t d, const at::BFloat16* kh,
                            const at::BFloat16* vh, const int64_t* slot_row, int64_t k0, int64_t k1, float scaling,
                            TileScratch& sc) {
  const int64_t nq = rows * group;
  const int64_t mpad = Tiles::padded(nq);
  Tiles::begin(nq);
  const float c = scaling * 1.44269504088896341f;  // scores to base-2 exponents (exp_to_bf16)
  ValueRows<at::BFloat16> v;
  v.direct = true;
  for (int64_t j0 = k0; j0 < k1; j0 += BLOCK) {
    const int64_t nblock = std::min(BLOCK, k1 - j0);
    if (j0 + BLOCK < k1) prefetch_keys_l2(kh, vh, slot_row, j0 + BLOCK, std::min(k1, j0 + 2 * BLOCK), d);
    load_block_pairs(kh, vh, slot_row, j0, nblock, d, sc.kp.data(), sc.unused, v);
    const bool raw_values = Tiles::reads_value_rows(mpad);  // else V is re-laid as pairs once for all rows
    // Keys padded to whole 32-key steps of pair_values, or, for V read from its rows, to a whole pair
    // only: the pad keys' products are exact zeros either way (p = 0, zero V rows), so only the work
    // changes (a decode item's own keys end in a partial block: up to 30 pad keys a request and head).
    const int64_t npad = raw_values ? (nblock + 1) / 2 * 2 : (nblock + 31) / 32 * 32;
    if (!raw_values) pair_values(v.raw, nblock, npad, d, sc.vp.data());
    Tiles::scores(sc.q.data(), sc.kp.data(), mpad, (nblock + 15) / 16 * 16, d, sc.s.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = std::min(BLOCK, lens[r] - j0);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t qi = r * group + g;
        float* sq = sc.s.data() + qi * BLOCK;
        at::BFloat16* pq = sc.p.data() + qi * BLOCK;
        if (n <= 0) {  // the row does not see this block: p = 0 adds nothing
          std::fill(pq, pq + npad, c10::BFloat16(0.f));
          continue;
        }
        const float mnew = std::max(sc.m[qi], block_max(sq, n) * c);
        if (sc.m[qi] != -std::numeric_limits<float>::infinity() && mnew != sc.m[qi]) {
          const float corr = std::exp2(sc.m[qi] - mnew);
          sc.l[qi] *= corr;
          scale(sc.acc.data() + qi * d, corr, d);
        }
        sc.m[qi] = mnew;
        sc.l[qi] += exp_to_bf16(sq, c, mnew, n, npad, pq);
      }
    }
    for (int64_t qi = nq; qi < mpad; ++qi) {  // pad vectors: p = 0 (their accumulators are never read)
      std::fill(sc.p.data() + qi * BLOCK, sc.p.data() + qi * BLOCK + npad, c10::BFloat16(0.f));
    }
    Tiles::accumulate(sc.p.data(), raw_values ? nullptr : sc.vp.data(), v.raw, nblock, mpad, npad, d, sc.acc.data());
  }
}

// The rows' G query vectors each into sc.q (query vector r * G + g).
inline void load_tile_queries(const at::BFloat16* qp, const int64_t* qrows, int64_t rows, int64_t h, int64_t heads,
                              int64_t group, int64_t d, TileScratch& sc) {
  for (int64_t r = 0; r < rows; ++r) {
    const at::BFloat16* src = qp + (qrows[r] * heads + h * group) * d;  // a row's G vectors are contiguous
    std::copy(src, src + group * d, sc.q.data() + r * group * d);
  }
}

// attend_shared on the pair tile path: the cascade's prefix pass for query rows qrows[0..n) (n <= SHARED_TILE).
template <typename Tiles>
inline void attend_shared_tiles(const int64_t* qrows, int64_t n, int64_t h, const at::BFloat16* qp,
                              const at::BFloat16* kp, const at::BFloat16* vp, const int64_t* slot_row, int64_t plen,
                              int64_t heads, int64_t group, int64_t d, int64_t slots, float scaling, RowState st,
                              TileScratch& sc) {
  load_tile_queries(qp, qrows, n, h, heads, group, d, sc);
  start_rows(0, qrows, n, h, heads, group, d, st, sc.m, sc.l, sc.acc);
  int64_t lens[SHARED_TILE];
  std::fill(lens, lens + n, plen);
  attend_rows_tiles<Tiles>(n, lens, group, d, kp + h * slots * d, vp + h * slots * d, slot_row, 0, plen, scaling, sc);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t qi = r * group + g, sq = qrows[r] * heads + h * group + g;
      st.m[sq] = sc.m[qi];
      st.l[sq] = sc.l[qi];
      std::copy(sc.acc.data() + qi * d, sc.acc.data() + (qi + 1) * d, st.acc + sq * d);
    }
  }
}

// attend_item on the pair tile path.
template <typename Tiles>
inline void attend_item_tiles(const Item& it, const at::BFloat16* qp, const at::BFloat16* kp, const at::BFloat16* vp,
                            const int64_t* slot_row, int64_t prefix, int64_t key_begin, int64_t q_row0, int64_t heads,
                            int64_t group, int64_t d, int64_t slots, float scaling, RowState st, at::BFloat16* op,
                            TileScratch& sc) {
  int64_t qrows[AMX_ITEM_ROWS], lens[AMX_ITEM_ROWS];  // an item has at most AMX_ITEM_ROWS rows (TILE off AMX)
  for (int64_t r = 0; r < it.rows; ++r) {
    qrows[r] = q_row0 + it.row0 + r;
    lens[r] = prefix + it.row0 + r + 1;
  }
  load_tile_queries(qp, qrows, it.rows, it.h, heads, group, d, sc);
  start_rows(key_begin, qrows, it.rows, it.h, heads, group, d, st, sc.m, sc.l, sc.acc);
  attend_rows_tiles<Tiles>(it.rows, lens, group, d, kp + it.h * slots * d, vp + it.h * slots * d, slot_row, key_begin,
                  prefix + it.row0 + it.rows, scaling, sc);
  finish_rows<at::BFloat16>(qrows, it.rows, it.h, heads, group, d, sc.l, sc.acc, op);
}
#endif  // CPU_CAPABILITY_AVX512
