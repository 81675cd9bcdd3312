// Paged causal attention over an HND KV pool for a whole batch in one call per layer (CPU):
// extend (prefill, prefill chunks after a cached prefix) and decode (one query per request) alike.
//
// Each request's query rows attend over its KV slots, listed by its req_to_token row (SGLang's
// req_to_token / FlashInfer's paged-KV indices). The new tokens' K/V are written into the pool first
// (KVPool.set_kv), so one call does the store and the attention.
//
// Work items are (request, KV head, tile of up to TILE query rows; AMX: up to AMX_ITEM_ROWS), run in
// torch's OpenMP pool (at::parallel_for, so the thread count and wait policy are the process's), each
// thread on its own list first and then on the others' leftovers (work_stealing.h). An item computes
// the rows x G (= H / KVH) query vectors that share the KV head, so a K/V row is loaded once for all of
// them, in blocks of BLOCK keys:
// scores = q . k (fp32; K transposed per block so a vector of keys' scores is one chain of FMAs, with up
// to 4 query vectors of a row, or 6 of two rows that both see the whole block (row_pair_step), sharing
// each K and V load), a running max and normaliser per head (online softmax, Milakov & Gimelshein 2018; FlashDecoding),
// then acc += p * v. K/V may be fp32, bf16 or fp16; arithmetic is fp32.
// bf16 pools on CPUs with AMX-BF16 or AVX512-BF16 (Sapphire Rapids, Zen 4 / 5, Cooper Lake) take the
// pair tile path instead (pair_tile_attention.h): both products on bf16 pairs, P rounded to bf16,
// base-2 exponentials. The path is chosen per CPU, so extend and decode rows still run the same
// operations.
// Vectorised with ATen's at::vec (AVX2 / AVX-512 chosen by the CPU_CAPABILITY macros at build time);
// exp is Sleef's 1-ulp expf, as torch's own softmax uses.
//
// Cascade (shared prefixes; Hydragen, Juravsky et al. 2024; FlashInfer's cascade wrappers): requests
// whose req_to_token rows start with the same P slots (radix-cache hits on one prefix; P a multiple
// of BLOCK) are given as groups. A first pass walks each group's prefix blocks once for all of the
// group's query rows together, so a prefix K/V block is read from memory once per group instead of
// once per request, and leaves every row's online-softmax state (max, normaliser, accumulator); the
// second pass continues each request from that state over its own keys. The blocks and the per-row
// operations are the same as without cascade, so the output is bitwise the same.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <torch/library.h>

#include "../../elementwise/cpu/bf16_avx512.h"
#include "../../elementwise/cpu/exp2_avx512.h"
#include "../../gemm/cpu/amx_tiles.h"
#include "../../gemm/cpu/transpose.h"
#include "../../gemm/cpu/work_stealing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t BLOCK = 128;   // keys per softmax block
constexpr int64_t TILE = 16;     // query rows of one request per work item (they share K/V loads)
constexpr int64_t AMX_ITEM_ROWS = 64;  // up to this many on the AMX path (see attention_kernel)
constexpr int64_t SHARED_TILE = 128;  // query rows (any requests of a group) per cascade work item

// Row of D elements as fp32: fp32 rows are used in place, others converted into `buf`.
template <typename T>
inline const float* as_float(const T* row, float* buf, int64_t d) {
  int64_t i = 0;
  for (; i + Vec::size() <= d; i += Vec::size()) {
    at::vec::convert<T, float>(row + i, buf + i, Vec::size());
  }
  for (; i < d; ++i) buf[i] = static_cast<float>(row[i]);
  return buf;
}
template <>
inline const float* as_float<float>(const float* row, float*, int64_t) { return row; }

inline void scale(float* y, float a, int64_t d) {
  const Vec va(a);
  int64_t i = 0;
  for (; i + Vec::size() <= d; i += Vec::size()) (Vec::loadu(y + i) * va).store(y + i);
  for (; i < d; ++i) y[i] *= a;
}

// max(s[0..n)) (exact in any order; n >= 1). A NaN score may or may not reach the maximum; either way
// its exponential is NaN, so the output row is NaN as with any NaN-propagating maximum.
inline float block_max(const float* s, int64_t n) {
#ifdef CPU_CAPABILITY_AVX512
  // vmaxps without at::vec::maximum's NaN blend, and one reduction per call: ~2x fewer instructions
  // per score on the pair tile path, where this runs once per query vector and key block.
  __m512 acc = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_loadu_ps(s + i));
  if (i < n) acc = _mm512_max_ps(acc, _mm512_mask_loadu_ps(acc, static_cast<__mmask16>((1u << (n - i)) - 1), s + i));
  return _mm512_reduce_max_ps(acc);
#else
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
  if (n >= Vec::size()) {
    Vec acc = Vec::loadu(s);
    for (i = Vec::size(); i + Vec::size() <= n; i += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(s + i));
    m = at::vec::vec_reduce_all<float>([](const Vec& x, const Vec& y) { return at::vec::maximum(x, y); }, acc);
  }
  for (; i < n; ++i) m = std::max(m, s[i]);
  return m;
#endif
}

// s[0..n) = exp(s - m); returns the sum.
inline float exp_sub_sum(float* s, float m, int64_t n) {
  const Vec vm(m);
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec e = (Vec::loadu(s + i) - vm).exp();
    e.store(s + i);
    acc = acc + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](const Vec& x, const Vec& y) { return x + y; }, acc);
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  return sum;
}

template <typename T>
void store_kv(at::Tensor& cache, const at::Tensor& src, const int64_t* loc, int64_t tokens) {
  // cache (KVH, slots, D); src (T, KVH, D) with unit stride in D (a view into a fused qkv output is fine)
  const int64_t kvh = cache.size(0), slots = cache.size(1), d = cache.size(2);
  const int64_t s0 = src.stride(0), s1 = src.stride(1);
  T* dst = cache.data_ptr<T>();
  const T* s = src.data_ptr<T>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < kvh; ++h) {
      std::copy(s + t * s0 + h * s1, s + t * s0 + h * s1 + d, dst + (h * slots + loc[t]) * d);
    }
  }
}

// Start row of each request's queries (B + 1 entries); checks every length against the pools.
std::vector<int64_t> query_starts(int64_t tokens, int64_t ctx, const at::Tensor& prefix_lens,
                                  const at::Tensor& extend_lens) {
  const int64_t bs = prefix_lens.numel();
  const int64_t* pre = prefix_lens.data_ptr<int64_t>();
  const int64_t* ext = extend_lens.data_ptr<int64_t>();
  std::vector<int64_t> q_start(bs + 1, 0);
  for (int64_t b = 0; b < bs; ++b) {
    TORCH_CHECK(ext[b] >= 1 && pre[b] >= 0 && pre[b] + ext[b] <= ctx, "request ", b, ": prefix_len ", pre[b],
                " + extend_len ", ext[b], " outside [1, ", ctx, "]");
    q_start[b + 1] = q_start[b] + ext[b];
  }
  TORCH_CHECK(q_start[bs] == tokens, "extend_lens sum to ", q_start[bs], " but q has ", tokens, " rows");
  return q_start;
}

struct Item {
  int64_t b, h, row0, rows, cost;
};

// Online-softmax state of one query vector: running max, normaliser and (unnormalised) accumulator.
struct RowState {
  float* m;    // (T * H,)
  float* l;    // (T * H,)
  float* acc;  // (T * H, D)
};

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
inline __m256 load8_as_float(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_as_float(const at::BFloat16* p) {  // exact: a bf16 is the top half of an fp32
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8_as_float(const at::Half* p) {  // exact (F16C)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// dst[c * ld + r] = float(rows[r][c0 + c]) for an 8 x 8 block (rows r = 0..7, columns c = 0..7).
template <typename T>
inline void transpose8x8(const T* const* rows, int64_t c0, float* dst, int64_t ld) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = load8_as_float(rows[i] + c0);
  radixlm_gemm::transpose8x8_store(r, dst, ld);
}
#endif

// Brings a K/V row of d elements towards L1 (a hint: no effect on results).
template <typename T>
inline void prefetch_row(const T* row, int64_t d) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(p + b, 0, 3);
}

// Brings the K and V rows of keys [j0, j1) towards L2 (hints: no effect on results). A thread asks for
// its next work item's first block before computing the current one, so the item's short streams
// (a request's keys, ~128 B each) arrive while it computes instead of after it starts; a decode step
// reads every KV row from memory once, and without this ran at ~7 of the ~26 GB/s the machine reads.
template <typename T>
inline void prefetch_keys_l2(const T* kh, const T* vh, const int64_t* slot_row, int64_t j0, int64_t j1, int64_t d) {
  const int64_t bytes = d * static_cast<int64_t>(sizeof(T));
  for (int64_t j = j0; j < j1; ++j) {
    const char* k = reinterpret_cast<const char*>(kh + slot_row[j] * d);
    const char* v = reinterpret_cast<const char*>(vh + slot_row[j] * d);
    for (int64_t b = 0; b < bytes; b += 64) {
      __builtin_prefetch(k + b, 0, 2);
      __builtin_prefetch(v + b, 0, 2);
    }
  }
}

// A key block's V rows: fp32 rows (`f`: converted into the item's vblock by load_values, or the pool's
// own rows when it is fp32) or, for an item of one query row (a decode step), the pool's rows as they
// are (`raw`, widened in registers where they are used). The widening is exact, so both give the same
// values and the same result; `raw` only saves storing and reloading a row that one row reads once.
template <typename T>
struct ValueRows {
  const float* f[BLOCK];
  const T* raw[BLOCK];
  bool direct = false;
};

// The V rows of keys [j0, j0 + n): the pool's rows if v.direct (for_key_octets prefetched them), else
// fp32 rows (converted into vblock unless the pool is fp32), prefetched a few rows ahead.
template <typename T>
inline void load_values(const T* vh, const int64_t* slot_row, int64_t j0, int64_t n, int64_t d,
                        std::vector<float>& vblock, ValueRows<T>& v) {
  if (v.direct) {
    for (int64_t j = 0; j < n; ++j) v.raw[j] = vh + slot_row[j0 + j] * d;
    return;
  }
  const float** vrows = v.f;
  constexpr int64_t kAhead = 16;
  for (int64_t j = 0; j < std::min(n, kAhead); ++j) prefetch_row(vh + slot_row[j0 + j] * d, d);
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_row(vh + slot_row[j0 + j + kAhead] * d, d);
    vrows[j] = as_float<T>(vh + slot_row[j0 + j] * d, vblock.data() + j * d, d);
  }
}

// One vector of fp32 values from p[0 .. Vec::size()) (exact widening of bf16 / fp16).
inline Vec load_as_vec(const float* p) { return Vec::loadu(p); }
template <typename T>
inline Vec load_as_vec(const T* p) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return Vec(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  } else {
    return Vec(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
#elif defined(CPU_CAPABILITY_AVX2)
  return Vec(load8_as_float(p));
#else
  float buf[Vec::size()];
  for (int64_t i = 0; i < Vec::size(); ++i) buf[i] = static_cast<float>(p[i]);
  return Vec::loadu(buf);
#endif
}

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// fn(j, rows) for j = 0, 8, ... over keys [j0, j0 + n) padded to a whole vector of keys: rows[r] is
// key j0 + j + r's K row (d <= 256 elements; a zero row past n). K/V rows sit wherever the slots are:
// the rows are asked for a few steps ahead of their use, so the loads of a decode step (which streams
// the whole KV cache once) overlap instead of queueing.
// With `vh` (V rows the caller reads from the pool itself), the same keys' V rows are asked for too.
template <typename T, typename Fn>
inline void for_key_octets(const T* kh, const T* vh, const int64_t* slot_row, int64_t j0, int64_t n, int64_t d,
                           Fn&& fn) {
  static thread_local T zeros[256] = {};
  const int64_t padded = (n + Vec::size() - 1) / Vec::size() * Vec::size();
  constexpr int64_t kAhead = 16;
  auto ask = [&](int64_t a) {
    prefetch_row(kh + slot_row[j0 + a] * d, d);
    if (vh != nullptr) prefetch_row(vh + slot_row[j0 + a] * d, d);
  };
  for (int64_t j = 0; j < std::min(n, kAhead); ++j) ask(j);
  for (int64_t j = 0; j < padded; j += 8) {
    for (int64_t a = j + kAhead; a < std::min(n, j + kAhead + 8); ++a) ask(a);
    const T* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = j + r < n ? kh + slot_row[j0 + j + r] * d : zeros;
    fn(j, rows);
  }
}
#endif

// Keys [j0, j0 + n) of one KV head: K transposed into kT (D, BLOCK) fp32, zero-padded to a whole
// vector of keys, and pointers to the fp32 V rows (converted into vblock unless the pool is fp32).
// With AVX2, K is transposed 8 keys x 8 dimensions at a time (pad keys read a zero row); values are
// moved (and widened exactly), not computed, so both ways give the same kT.
template <typename T>
inline void load_block(const T* kh, const T* vh, const int64_t* slot_row, int64_t j0, int64_t n, int64_t d,
                       float* kT, std::vector<float>& vblock, ValueRows<T>& v) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  if (d % 8 == 0 && d <= 256) {
    for_key_octets<T>(kh, v.direct ? vh : nullptr, slot_row, j0, n, d, [&](int64_t j, const T* const* rows) {
      for (int64_t c = 0; c < d; c += 8) transpose8x8<T>(rows, c, kT + c * BLOCK + j, BLOCK);
    });
    load_values<T>(vh, slot_row, j0, n, d, vblock, v);
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    const T* kr = kh + slot_row[j0 + j] * d;
    for (int64_t i = 0; i < d; ++i) kT[i * BLOCK + j] = static_cast<float>(kr[i]);
  }
  load_values<T>(vh, slot_row, j0, n, d, vblock, v);
  const int64_t padded = (n + Vec::size() - 1) / Vec::size() * Vec::size();
  for (int64_t i = 0; i < d; ++i) std::fill(kT + i * BLOCK + n, kT + i * BLOCK + padded, 0.f);
}

#ifdef CPU_CAPABILITY_AVX512
// Keys [j0, j0 + n) of one bf16 KV head for the pair tile path: kP[i * BLOCK + j] = the 32-bit pair
// (k_j[2i], k_j[2i + 1]) for i < d / 2, zero-padded to a whole vector of keys; V rows as in load_block.
// The pairs are moved as 32-bit lanes with the same 8 x 8 transpose (bits, not values).
inline void load_block_pairs(const at::BFloat16* kh, const at::BFloat16* vh, const int64_t* slot_row, int64_t j0,
                             int64_t n, int64_t d, uint32_t* kP, std::vector<float>& vblock,
                             ValueRows<at::BFloat16>& v) {
  float* dst = reinterpret_cast<float*>(kP);
  for_key_octets<at::BFloat16>(kh, v.direct ? vh : nullptr, slot_row, j0, n, d,
                               [&](int64_t j, const at::BFloat16* const* rows) {
    for (int64_t c = 0; c < d / 2; c += 8) {  // c counts pairs: 8 pairs = 16 bf16 of each row
      __m256 r8[8];
      for (int r = 0; r < 8; ++r) r8[r] = _mm256_loadu_ps(reinterpret_cast<const float*>(rows[r]) + c);
      radixlm_gemm::transpose8x8_store(r8, dst + c * BLOCK + j, BLOCK);
    }
  });
  load_values<at::BFloat16>(vh, slot_row, j0, n, d, vblock, v);
}

#endif

// Scores of NQ query vectors (qv, stride d) against NV vectors of keys from jv, into s (stride BLOCK per
// query): per score, one chain of fused multiply-adds over the head dimension, the same chain
// whatever NQ and NV are (the blocking only shares the K loads between queries).
template <int NQ, int NV>
inline void scores_tile(const float* qv, int64_t d, const float* kT, int64_t jv, float* s) {
  Vec acc[NQ][NV];
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) acc[q][v] = Vec(0.f);
  for (int64_t i = 0; i < d; ++i) {
    const float* row = kT + i * BLOCK + jv;
    Vec k[NV];
    for (int v = 0; v < NV; ++v) k[v] = Vec::loadu(row + v * Vec::size());
    for (int q = 0; q < NQ; ++q) {
      const Vec qi(qv[q * d + i]);
      for (int v = 0; v < NV; ++v) acc[q][v] = at::vec::fmadd(qi, k[v], acc[q][v]);
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) acc[q][v].store(s + q * BLOCK + jv + v * Vec::size());
}

// a_q[c .. c + NV * Vec::size()) += sum_j p_q[j] * v_j[...] for NQ queries (a stride d, p stride
// BLOCK): one multiply-add chain over the keys per element, whatever NQ and NV are.
template <int NQ, int NV, typename VT>
inline void accumulate_tile(float* a, int64_t d, const float* p, const VT* const* vrows, int64_t n, int64_t c) {
  Vec acc[NQ][NV];
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) acc[q][v] = Vec::loadu(a + q * d + c + v * Vec::size());
  for (int64_t j = 0; j < n; ++j) {
    Vec x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load_as_vec(vrows[j] + c + v * Vec::size());
    for (int q = 0; q < NQ; ++q) {
      const Vec pj(p[q * BLOCK + j]);
      for (int v = 0; v < NV; ++v) acc[q][v] = at::vec::fmadd(pj, x[v], acc[q][v]);
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) acc[q][v].store(a + q * d + c + v * Vec::size());
}

template <int NQ>
inline void scores_queries(const float* qv, int64_t d, const float* kT, int64_t n, float* s) {
  constexpr int64_t W = Vec::size();
  int64_t jv = 0;
  if constexpr (NQ <= 3) {  // 4 vectors of keys: 4 * NQ independent FMA chains hide the FMA latency
    for (; jv + 4 * W <= n; jv += 4 * W) scores_tile<NQ, 4>(qv, d, kT, jv, s);
  }
  for (; jv + 2 * W <= n; jv += 2 * W) scores_tile<NQ, 2>(qv, d, kT, jv, s);
  for (; jv < n; jv += W) scores_tile<NQ, 1>(qv, d, kT, jv, s);  // pad keys are zeros; their scores unused
}

template <int NQ, typename VT>
inline void accumulate_queries(float* a, int64_t d, const float* p, const VT* const* vrows, int64_t n) {
  constexpr int64_t W = Vec::size();
  int64_t c = 0;
  if constexpr (NQ <= 3) {
    for (; c + 4 * W <= d; c += 4 * W) accumulate_tile<NQ, 4, VT>(a, d, p, vrows, n, c);
  }
  for (; c + 2 * W <= d; c += 2 * W) accumulate_tile<NQ, 2, VT>(a, d, p, vrows, n, c);
  for (; c + W <= d; c += W) accumulate_tile<NQ, 1, VT>(a, d, p, vrows, n, c);
  for (; c < d; ++c) {
    for (int q = 0; q < NQ; ++q) {
      float x = a[q * d + c];
      for (int64_t j = 0; j < n; ++j) x = std::fma(p[q * BLOCK + j], static_cast<float>(vrows[j][c]), x);
      a[q * d + c] = x;
    }
  }
}

template <typename T>
inline void softmax_accumulate(int64_t group, const ValueRows<T>& v, int64_t n, int64_t d, float* s, float* m, float* l,
                               float* a);

// One key block for the G query vectors of one query row (qv (G, D), scores s (G, BLOCK), state m, l
// (G,) and a (G, D)): the step every row runs for every block it sees, in every pass, so where a
// row is computed never changes its result. kT is the block's transposed K.
template <typename T>
inline void row_step(const float* qv, int64_t group, const float* kT, const ValueRows<T>& v, int64_t n, int64_t d,
                     float* s, float* m, float* l, float* a) {
  for (int64_t q0 = 0; q0 < group; q0 += 4) {
    const float* qq = qv + q0 * d;
    float* sq = s + q0 * BLOCK;
    switch (std::min<int64_t>(4, group - q0)) {
      case 4: scores_queries<4>(qq, d, kT, n, sq); break;
      case 3: scores_queries<3>(qq, d, kT, n, sq); break;
      case 2: scores_queries<2>(qq, d, kT, n, sq); break;
      default: scores_queries<1>(qq, d, kT, n, sq); break;
    }
  }
  softmax_accumulate<T>(group, v, n, d, s, m, l, a);
}

// The online-softmax update of G query vectors from their scores s (G, BLOCK) over n keys, then
// a += p * v; s is overwritten with p.
template <typename VT>
inline void accumulate_rows(int64_t group, const VT* const* vrows, int64_t n, int64_t d, const float* s, float* a) {
  for (int64_t q0 = 0; q0 < group; q0 += 4) {
    float* aq = a + q0 * d;
    const float* pq = s + q0 * BLOCK;
    switch (std::min<int64_t>(4, group - q0)) {
      case 4: accumulate_queries<4>(aq, d, pq, vrows, n); break;
      case 3: accumulate_queries<3>(aq, d, pq, vrows, n); break;
      case 2: accumulate_queries<2>(aq, d, pq, vrows, n); break;
      default: accumulate_queries<1>(aq, d, pq, vrows, n); break;
    }
  }
}

template <typename T>
inline void softmax_accumulate(int64_t group, const ValueRows<T>& v, int64_t n, int64_t d, float* s, float* m, float* l,
                               float* a) {
  for (int64_t q = 0; q < group; ++q) {
    float* sq = s + q * BLOCK;
    const float bmax = block_max(sq, n);
    const float mnew = std::max(m[q], bmax);
    if (m[q] != -std::numeric_limits<float>::infinity() && mnew != m[q]) {
      const float corr = std::exp(m[q] - mnew);
      l[q] *= corr;
      scale(a + q * d, corr, d);
    }
    m[q] = mnew;
    l[q] += exp_sub_sum(sq, mnew, n);
  }
  if constexpr (!std::is_same_v<T, float>) {
    if (v.direct) return accumulate_rows<T>(group, v.raw, n, d, s, a);
  }
  accumulate_rows<float>(group, v.f, n, d, s, a);
}

// a_q[c .. c + NV * Vec::size()) += sum_j p_q[j] * v_j[...] for NQ query vectors whose accumulators
// sit at a[q] (p stride BLOCK): accumulate_tile's chains (one per element, over the keys in order).
template <int NQ, int NV>
inline void accumulate_tile_at(float* const* a, const float* p, const float* const* vrows, int64_t n, int64_t c) {
  Vec acc[NQ][NV];
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) acc[q][v] = Vec::loadu(a[q] + c + v * Vec::size());
  for (int64_t j = 0; j < n; ++j) {
    Vec x[NV];
    for (int v = 0; v < NV; ++v) x[v] = Vec::loadu(vrows[j] + c + v * Vec::size());
    for (int q = 0; q < NQ; ++q) {
      const Vec pj(p[q * BLOCK + j]);
      for (int v = 0; v < NV; ++v) acc[q][v] = at::vec::fmadd(pj, x[v], acc[q][v]);
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) acc[q][v].store(a[q] + c + v * Vec::size());
}

template <int NQ>
inline void accumulate_queries_at(float* const* a, int64_t d, const float* p, const float* const* vrows, int64_t n) {
  constexpr int64_t W = Vec::size();
  int64_t c = 0;
  for (; c + 2 * W <= d; c += 2 * W) accumulate_tile_at<NQ, 2>(a, p, vrows, n, c);
  for (; c + W <= d; c += W) accumulate_tile_at<NQ, 1>(a, p, vrows, n, c);
  for (; c < d; ++c) {
    for (int q = 0; q < NQ; ++q) {
      float x = a[q][c];
      for (int64_t j = 0; j < n; ++j) x = std::fma(p[q * BLOCK + j], vrows[j][c], x);
      a[q][c] = x;
    }
  }
}

// Two query rows that both see the same n keys of a block (every row of a cascade pass; rows before
// the diagonal of a prefill item): row_step's operations for each of their 2G query vectors (the same
// score chains, softmax and accumulation chains, so the same bits), with each K and V load of the
// block shared by both rows' query vectors (6 x 16 register tiles at G = 3 instead of 3 x 32: half the
// block's reads from L2, where a 128-key block of fp32 K and V, 64 KB, sits). qv: the 2G query vectors
// (contiguous); s: 2G x BLOCK scratch; each row's state (m, l: G floats, a: G x D) where it lives. V
// rows as fp32 (v.f): the pair path is not taken for items of one row, the only ones with v.direct.
template <typename T>
inline void row_pair_step(const float* qv, int64_t group, const float* kT, const ValueRows<T>& v, int64_t n, int64_t d,
                          float* s, float* const* m, float* const* l, float* const* a) {
  const int64_t nq = 2 * group;
  for (int64_t q0 = 0; q0 < nq; q0 += 6) {
    const float* qq = qv + q0 * d;
    float* sq = s + q0 * BLOCK;
    switch (std::min<int64_t>(6, nq - q0)) {
      case 6: scores_queries<6>(qq, d, kT, n, sq); break;
      case 5: scores_queries<5>(qq, d, kT, n, sq); break;
      case 4: scores_queries<4>(qq, d, kT, n, sq); break;
      case 3: scores_queries<3>(qq, d, kT, n, sq); break;
      case 2: scores_queries<2>(qq, d, kT, n, sq); break;
      default: scores_queries<1>(qq, d, kT, n, sq); break;
    }
  }
  float* aq[12];
  for (int64_t q = 0; q < nq; ++q) {
    const int row = q < group ? 0 : 1;
    const int64_t g = q - row * group;
    float* sq = s + q * BLOCK;
    float* mq = m[row] + g;
    float* lq = l[row] + g;
    aq[q % 12] = a[row] + g * d;
    const float bmax = block_max(sq, n);
    const float mnew = std::max(*mq, bmax);
    if (*mq != -std::numeric_limits<float>::infinity() && mnew != *mq) {
      const float corr = std::exp(*mq - mnew);
      *lq *= corr;
      scale(aq[q % 12], corr, d);
    }
    *mq = mnew;
    *lq += exp_sub_sum(sq, mnew, n);
    if (q % 12 == 11 || q == nq - 1) {  // the accumulation of up to 12 query vectors, 6 at a time
      const int64_t first = q - q % 12;
      for (int64_t q0 = first; q0 <= q; q0 += 6) {
        float* const* ap = aq + (q0 - first);
        const float* pq = s + q0 * BLOCK;
        switch (std::min<int64_t>(6, q + 1 - q0)) {
          case 6: accumulate_queries_at<6>(ap, d, pq, v.f, n); break;
          case 5: accumulate_queries_at<5>(ap, d, pq, v.f, n); break;
          case 4: accumulate_queries_at<4>(ap, d, pq, v.f, n); break;
          case 3: accumulate_queries_at<3>(ap, d, pq, v.f, n); break;
          case 2: accumulate_queries_at<2>(ap, d, pq, v.f, n); break;
          default: accumulate_queries_at<1>(ap, d, pq, v.f, n); break;
        }
      }
    }
  }
}

// Query vectors of flat rows `qrows[0..n)` for KV head h, scaled, into qf (n * G, D).
template <typename T>
inline void load_queries(const T* qp, const int64_t* qrows, int64_t n, int64_t h, int64_t heads, int64_t group,
                         int64_t d, float scaling, std::vector<float>& qf) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const T* src = qp + (qrows[r] * heads + h * group + g) * d;
      float* dst = qf.data() + (r * group + g) * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(src[i]) * scaling;
    }
  }
}

// The online-softmax state (m, l, acc; query vector r * G + g) of query rows qrows[0..rows) over KV head
// h at the start of an item: empty, or (key_begin > 0, after the cascade pass) the pass's state in st.
inline void start_rows(int64_t key_begin, const int64_t* qrows, int64_t rows, int64_t h, int64_t heads, int64_t group,
                       int64_t d, RowState st, std::vector<float>& m, std::vector<float>& l, std::vector<float>& acc) {
  const int64_t nq = rows * group;
  if (key_begin == 0) {
    std::fill(m.begin(), m.begin() + nq, -std::numeric_limits<float>::infinity());
    std::fill(l.begin(), l.begin() + nq, 0.f);
    std::fill(acc.begin(), acc.begin() + nq * d, 0.f);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t qi = r * group + g, sq = qrows[r] * heads + h * group + g;
      m[qi] = st.m[sq];
      l[qi] = st.l[sq];
      std::copy(st.acc + sq * d, st.acc + (sq + 1) * d, acc.data() + qi * d);
    }
  }
}

// out rows of qrows[0..rows) over KV head h = acc / l, in the output dtype.
template <typename T>
inline void finish_rows(const int64_t* qrows, int64_t rows, int64_t h, int64_t heads, int64_t group, int64_t d,
                        const std::vector<float>& l, const std::vector<float>& acc, T* op) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t qi = r * group + g;
      T* dst = op + (qrows[r] * heads + h * group + g) * d;
      const float inv = 1.f / l[qi];
      int64_t i = 0;
#ifdef CPU_CAPABILITY_AVX512
      if constexpr (std::is_same_v<T, at::BFloat16>) {  // the same product and rounding, 16 lanes at a time
        for (; i + 16 <= d; i += 16) {
          radixlm_math::store_bf16x16(dst + i, _mm512_mul_ps(_mm512_loadu_ps(acc.data() + qi * d + i),
                                                                 _mm512_set1_ps(inv)));
        }
      }
#endif
      for (; i < d; ++i) dst[i] = static_cast<T>(acc[qi * d + i] * inv);
    }
  }
}

#include "pair_tile_attention.h"
#include "amx_attention.h"
#include "dpbf16_attention.h"

// Cascade first pass: the shared prefix (keys [0, plen), whole blocks) of one group for query rows
// qrows[0..n) over KV head h; every row sees all of it. Leaves each query vector's state in `st`.
template <typename T>
void attend_shared(const int64_t* qrows, int64_t n, int64_t h, const T* qp, const T* kp, const T* vp,
                   const int64_t* slot_row, int64_t plen, int64_t heads, int64_t group, int64_t d, int64_t slots,
                   float scaling, RowState st, std::vector<float>& qf, std::vector<float>& kblock,
                   std::vector<float>& vblock, std::vector<float>& scores) {
  load_queries<T>(qp, qrows, n, h, heads, group, d, scaling, qf);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t sq = qrows[r] * heads + h * group + g;
      st.m[sq] = -std::numeric_limits<float>::infinity();
      st.l[sq] = 0.f;
      std::fill(st.acc + sq * d, st.acc + (sq + 1) * d, 0.f);
    }
  }
  const T* kh = kp + h * slots * d;
  const T* vh = vp + h * slots * d;
  ValueRows<T> v;
  v.direct = n == 1 && !std::is_same_v<T, float>;
  for (int64_t j0 = 0; j0 < plen; j0 += BLOCK) {
    if (j0 + BLOCK < plen) prefetch_keys_l2(kh, vh, slot_row, j0 + BLOCK, std::min(plen, j0 + 2 * BLOCK), d);
    load_block<T>(kh, vh, slot_row, j0, BLOCK, d, kblock.data(), vblock, v);
    int64_t r = 0;
    if (!v.direct) {
      for (; r + 1 < n; r += 2) {
        const int64_t s0 = qrows[r] * heads + h * group, s1 = qrows[r + 1] * heads + h * group;
        float* m2[2] = {st.m + s0, st.m + s1};
        float* l2[2] = {st.l + s0, st.l + s1};
        float* a2[2] = {st.acc + s0 * d, st.acc + s1 * d};
        row_pair_step<T>(qf.data() + r * group * d, group, kblock.data(), v, BLOCK, d, scores.data(), m2, l2, a2);
      }
    }
    for (; r < n; ++r) {
      const int64_t sq = qrows[r] * heads + h * group;  // the row's G query vectors are contiguous in q and st
      row_step<T>(qf.data() + r * group * d, group, kblock.data(), v, BLOCK, d, scores.data(), st.m + sq, st.l + sq,
                  st.acc + sq * d);
    }
  }
}

// Attention of query rows [row0, row0 + rows) of request b over KV head h. Row i of the request sits
// at position prefix + i and sees keys [0, prefix + i]. Keys before `key_begin` (a multiple of BLOCK,
// 0 without cascade) were done by the cascade pass, whose state in `st` the rows continue from.
// Every row runs the same sequence of operations whatever tile, batch, pass or step it is in (key
// blocks at multiples of BLOCK, the same reductions), so a token's output is bitwise the same in a
// prefill, a prefill chunk, a decode step or any batch: the kernel is batch-invariant and
// extend/decode-consistent by construction.
template <typename T>
void attend_item(const Item& it, const T* qp, const T* kp, const T* vp, const int64_t* slot_row, int64_t prefix,
                 int64_t key_begin, int64_t q_row0, int64_t heads, int64_t group, int64_t d, int64_t slots,
                 float scaling, RowState st, T* op, std::vector<float>& qf, std::vector<float>& acc,
                 std::vector<float>& kblock, std::vector<float>& vblock, std::vector<float>& scores,
                 std::vector<float>& m, std::vector<float>& l) {
  int64_t qrows[TILE];
  for (int64_t r = 0; r < it.rows; ++r) qrows[r] = q_row0 + it.row0 + r;
  load_queries<T>(qp, qrows, it.rows, it.h, heads, group, d, scaling, qf);
  start_rows(key_begin, qrows, it.rows, it.h, heads, group, d, st, m, l, acc);
  const T* kh = kp + it.h * slots * d;
  const T* vh = vp + it.h * slots * d;
  const int64_t last_len = prefix + it.row0 + it.rows;  // keys seen by the item's last row
  ValueRows<T> v;
  v.direct = it.rows == 1 && !std::is_same_v<T, float>;
  for (int64_t j0 = key_begin; j0 < last_len; j0 += BLOCK) {
    const int64_t nblock = std::min(BLOCK, last_len - j0);
    if (j0 + BLOCK < last_len) prefetch_keys_l2(kh, vh, slot_row, j0 + BLOCK, std::min(last_len, j0 + 2 * BLOCK), d);
    load_block<T>(kh, vh, slot_row, j0, nblock, d, kblock.data(), vblock, v);
    for (int64_t r = 0; r < it.rows; ++r) {
      const int64_t len = prefix + it.row0 + r + 1;
      if (len <= j0) continue;
      const int64_t n = std::min(BLOCK, len - j0);
      const int64_t qi = r * group;
      if (!v.direct && n == BLOCK && r + 1 < it.rows) {  // the next row sees the whole block too
        float* m2[2] = {m.data() + qi, m.data() + qi + group};
        float* l2[2] = {l.data() + qi, l.data() + qi + group};
        float* a2[2] = {acc.data() + qi * d, acc.data() + (qi + group) * d};
        row_pair_step<T>(qf.data() + qi * d, group, kblock.data(), v, n, d, scores.data(), m2, l2, a2);
        ++r;
        continue;
      }
      row_step<T>(qf.data() + qi * d, group, kblock.data(), v, n, d, scores.data(), m.data() + qi, l.data() + qi,
                  acc.data() + qi * d);
    }
  }
  finish_rows<T>(qrows, it.rows, it.h, heads, group, d, l, acc, op);
}

// Cascade groups, validated: group g is requests reqs[offsets[g] .. offsets[g+1]) sharing their
// first lens[g] slots. Returns each request's key_begin (0 outside every group).
std::vector<int64_t> cascade_key_begin(const at::Tensor& reqs, const at::Tensor& offsets, const at::Tensor& lens,
                                       const int64_t* table, const int64_t* rows, const int64_t* pre, int64_t bs,
                                       int64_t ctx) {
  std::vector<int64_t> begin(bs, 0);
  const int64_t ngroups = lens.numel();
  if (ngroups == 0) {
    TORCH_CHECK(reqs.numel() == 0 && offsets.numel() <= 1, "cascade_reqs given without cascade_lens");
    return begin;
  }
  TORCH_CHECK(offsets.numel() == ngroups + 1, "cascade_offsets needs one more entry than cascade_lens");
  const int64_t* rq = reqs.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* len = lens.data_ptr<int64_t>();
  TORCH_CHECK(off[0] == 0 && off[ngroups] == reqs.numel(), "cascade_offsets must run from 0 to cascade_reqs' size");
  std::vector<char> seen(bs, 0);
  for (int64_t g = 0; g < ngroups; ++g) {
    TORCH_CHECK(off[g + 1] > off[g], "cascade group ", g, " is empty");
    TORCH_CHECK(len[g] > 0 && len[g] % BLOCK == 0, "cascade_lens[", g, "] = ", len[g], " is not a positive multiple of ",
                BLOCK);
    const int64_t* first = nullptr;
    for (int64_t i = off[g]; i < off[g + 1]; ++i) {
      const int64_t b = rq[i];
      TORCH_CHECK(b >= 0 && b < bs && !seen[b], "cascade_reqs[", i, "] = ", b, " is outside the batch or repeated");
      seen[b] = 1;
      TORCH_CHECK(len[g] <= pre[b] && len[g] <= ctx, "cascade group ", g, " is longer than request ", b, "'s prefix");
      const int64_t* row = table + rows[b] * ctx;
      if (first == nullptr) first = row;
      TORCH_CHECK(std::equal(row, row + len[g], first), "request ", b, " does not share cascade group ", g, "'s slots");
      begin[b] = len[g];
    }
  }
  return begin;
}

template <typename T>
void attention_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                      const at::Tensor& prefix_lens, const at::Tensor& extend_lens, const std::vector<int64_t>& key_begin,
                      const at::Tensor& cascade_reqs, const at::Tensor& cascade_offsets,
                      const at::Tensor& cascade_lens, double scaling, at::Tensor& out) {
  const int64_t bs = req_pool_indices.numel(), heads = q.size(1), d = q.size(2);
  const int64_t kvh = k_cache.size(0), slots = k_cache.size(1);
  const int64_t group = heads / kvh;
  const int64_t ctx = req_to_token.size(1);
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t* rows = req_pool_indices.data_ptr<int64_t>();
  const int64_t* pre = prefix_lens.data_ptr<int64_t>();
  const int64_t* ext = extend_lens.data_ptr<int64_t>();
  const std::vector<int64_t> q_start = query_starts(q.size(0), ctx, prefix_lens, extend_lens);
  // bf16 pools on the pair tile path (pair_tile_attention.h) where the CPU has AMX-BF16 or AVX512-BF16.
  const bool amx = std::is_same_v<T, at::BFloat16> && use_amx_attention(d);
  const bool dp = std::is_same_v<T, at::BFloat16> && use_dp_attention(d);
  // Items of at most item_rows query rows; assigned to threads longest-first onto the least-loaded
  // thread (LPT), so long prefills do not leave a thread idle. On the AMX path an item re-lays every
  // key block it reads (K pair-transposed, V in pairs of keys) once for all its rows, so up to
  // AMX_ITEM_ROWS rows share that work (the kernel on a 512-row chunk after 2-8k cached keys: 0.75-0.81x
  // the time of 16-row items; 16 requests x 32 rows after 512 keys, no cascade: 0.85x; an 8,000-token
  // prefill end to end 0.81-0.99x; docs/benchmarks.md), but no more than a quarter of
  // one thread's share of the (row, KV head) pairs, so a short extend still makes items for every
  // thread. Which rows share an item does not change any row's bits.
  const int64_t item_rows =
      amx ? std::clamp<int64_t>((q.size(0) * kvh / (4 * std::max(1, at::get_num_threads())) + 15) / 16 * 16, TILE,
                                AMX_ITEM_ROWS)
          : TILE;
  std::vector<Item> items;
  for (int64_t b = 0; b < bs; ++b) {
    for (int64_t h = 0; h < kvh; ++h) {
      for (int64_t r0 = 0; r0 < ext[b]; r0 += item_rows) {
        const int64_t n = std::min(item_rows, ext[b] - r0);
        items.push_back({b, h, r0, n, n * (pre[b] + r0 + n - key_begin[b]) + 64});
      }
    }
  }
  const int64_t nthreads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items.size()));
  std::vector<std::vector<int64_t>> assigned(nthreads);
  {
    std::vector<int64_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return items[a].cost > items[b].cost; });
    std::vector<int64_t> load(nthreads, 0);
    for (int64_t i : order) {
      const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
      assigned[t].push_back(i);
      load[t] += items[i].cost;
    }
  }
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  // Cascade pass: (group, KV head, up to `tile` <= SHARED_TILE of the group's query rows) items.
  const int64_t ngroups = cascade_lens.numel();
  at::Tensor state;
  RowState st{nullptr, nullptr, nullptr};
  if (ngroups > 0) {
    state = at::empty({q.size(0) * heads * (d + 2)}, q.options().dtype(at::kFloat));
    float* base = state.data_ptr<float>();
    st = {base, base + q.size(0) * heads, base + 2 * q.size(0) * heads};
    const int64_t* rq = cascade_reqs.data_ptr<int64_t>();
    const int64_t* off = cascade_offsets.data_ptr<int64_t>();
    const int64_t* glen = cascade_lens.data_ptr<int64_t>();
    std::vector<int64_t> qrows;                     // flat query rows, group after group
    std::vector<std::array<int64_t, 4>> shared;     // (group, first row in qrows, rows, KV head)
    std::vector<int64_t> group_rows(ngroups + 1, 0);  // group g's rows: qrows[group_rows[g], group_rows[g + 1])
    for (int64_t g = 0; g < ngroups; ++g) {
      for (int64_t i = off[g]; i < off[g + 1]; ++i) {
        for (int64_t r = 0; r < ext[rq[i]]; ++r) qrows.push_back(q_start[rq[i]] + r);
      }
      group_rows[g + 1] = qrows.size();
    }
    // Rows per item: up to SHARED_TILE (each item re-lays a block's K / V once for all its rows), but no
    // more than a quarter of one thread's share of all (row, KV head) pairs, so that one large group
    // still makes enough items for the threads. Which rows share an item does not change any row's bits.
    const int64_t share = static_cast<int64_t>(qrows.size()) * kvh / (4 * std::max(1, at::get_num_threads())) + 1;
    const int64_t tile = std::clamp<int64_t>((share + 15) / 16 * 16, 16, SHARED_TILE);
    for (int64_t g = 0; g < ngroups; ++g) {
      for (int64_t r0 = group_rows[g]; r0 < group_rows[g + 1]; r0 += tile) {
        const int64_t n = std::min<int64_t>(tile, group_rows[g + 1] - r0);
        for (int64_t h = 0; h < kvh; ++h) shared.push_back({g, r0, n, h});
      }
    }
    // Cascade items round-robin over the threads (they cost about the same), stolen when a thread is late.
    const int64_t ct = radixlm_parallel::Shares(shared.size()).threads;
    auto shared_item = [&](int64_t t, int64_t u) { return shared[u * ct + t]; };
    auto shared_count = [&](int64_t t) { return (static_cast<int64_t>(shared.size()) - t + ct - 1) / ct; };
    radixlm_parallel::parallel_steal(ct, shared_count, [&](int64_t, int64_t, auto&& run) {
#ifdef CPU_CAPABILITY_AVX512
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        auto run_tiles = [&](auto engine) {
          using Tiles = decltype(engine);
          TileScratch& sc = tile_scratch(tile * group, d, Tiles::kRowMultiple);
          run([&](int64_t t, int64_t u) {
            const auto& [g, r0, n, h] = shared_item(t, u);
            attend_shared_tiles<Tiles>(qrows.data() + r0, n, h, qp, kp, vp, table + rows[rq[off[g]]] * ctx, glen[g],
                                       heads, group, d, slots, static_cast<float>(scaling), st, sc);
          });
          Tiles::release();
        };
        if (amx) return run_tiles(AmxTiles{});
        if (dp) return run_tiles(DpTiles{});
      }
#endif
      std::vector<float> qf(tile * group * d), kblock(BLOCK * d), vblock(BLOCK * d), scores(2 * group * BLOCK);
      run([&](int64_t t, int64_t u) {
        const auto& [g, r0, n, h] = shared_item(t, u);
        attend_shared<T>(qrows.data() + r0, n, h, qp, kp, vp, table + rows[rq[off[g]]] * ctx, glen[g], heads, group,
                         d, slots, static_cast<float>(scaling), st, qf, kblock, vblock, scores);
      });
    });
  }
  // Runs the items: each thread its own LPT list front to back (asking for its next item's first key
  // block before computing the current one), then the others' cheapest items from their backs.
  auto item_runner = [&](auto&& fn) {
    return [&, fn](int64_t t, int64_t x) {
      if (x + 1 < static_cast<int64_t>(assigned[t].size())) {
        const Item& nx = items[assigned[t][x + 1]];
        prefetch_keys_l2(kp + nx.h * slots * d, vp + nx.h * slots * d, table + rows[nx.b] * ctx, key_begin[nx.b],
                         std::min(pre[nx.b] + nx.row0 + nx.rows, key_begin[nx.b] + BLOCK), d);
      }
      fn(items[assigned[t][x]]);
    };
  };
  auto item_count = [&](int64_t t) { return static_cast<int64_t>(assigned[t].size()); };
  radixlm_parallel::parallel_steal(nthreads, item_count, [&](int64_t, int64_t, auto&& run) {
#ifdef CPU_CAPABILITY_AVX512
    if constexpr (std::is_same_v<T, at::BFloat16>) {
      auto run_tiles = [&](auto engine) {
        using Tiles = decltype(engine);
        TileScratch& sc = tile_scratch(item_rows * group, d, Tiles::kRowMultiple);
        run(item_runner([&](const Item& it) {
          attend_item_tiles<Tiles>(it, qp, kp, vp, table + rows[it.b] * ctx, pre[it.b], key_begin[it.b], q_start[it.b],
                                   heads, group, d, slots, static_cast<float>(scaling), st, op, sc);
        }));
        Tiles::release();
      };
      if (amx) return run_tiles(AmxTiles{});
      if (dp) return run_tiles(DpTiles{});
    }
#endif
    std::vector<float> qf(TILE * group * d), acc(TILE * group * d), kblock(BLOCK * d), vblock(BLOCK * d),
        scores(2 * group * BLOCK), m(TILE * group), l(TILE * group);
    run(item_runner([&](const Item& it) {
      attend_item<T>(it, qp, kp, vp, table + rows[it.b] * ctx, pre[it.b], key_begin[it.b], q_start[it.b], heads,
                     group, d, slots, static_cast<float>(scaling), st, op, qf, acc, kblock, vblock, scores, m, l);
    }));
  });
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, at::Tensor& k_cache,
         at::Tensor& v_cache, const int64_t* loc, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
         const at::Tensor& prefix_lens, const at::Tensor& extend_lens, const at::Tensor& cascade_reqs,
         const at::Tensor& cascade_offsets, const at::Tensor& cascade_lens, double scaling, at::Tensor& out) {
  // Validate everything before writing the pool.
  query_starts(q.size(0), req_to_token.size(1), prefix_lens, extend_lens);
  const int64_t bs = req_pool_indices.numel();
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t row = req_pool_indices.data_ptr<int64_t>()[b];
    TORCH_CHECK(row >= 0 && row < req_to_token.size(0), "req_pool_indices[", b, "] = ", row, " outside req_to_token");
  }
  const std::vector<int64_t> key_begin = cascade_key_begin(
      cascade_reqs, cascade_offsets, cascade_lens, req_to_token.data_ptr<int64_t>(), req_pool_indices.data_ptr<int64_t>(),
      prefix_lens.data_ptr<int64_t>(), bs, req_to_token.size(1));
  const int64_t slots = k_cache.size(1);
  for (int64_t t = 0; t < q.size(0); ++t) {
    TORCH_CHECK(loc[t] >= 0 && loc[t] < slots, "out_cache_loc ", loc[t], " outside the KV pool of ", slots, " slots");
  }
  store_kv<T>(k_cache, k_new, loc, q.size(0));
  store_kv<T>(v_cache, v_new, loc, q.size(0));
  attention_kernel<T>(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, key_begin,
                      cascade_reqs, cascade_offsets, cascade_lens, scaling, out);
}

// q (T, H, D) contiguous; k_new, v_new (T, KVH, D) with unit stride in D (views into a fused qkv output
// are fine): the batch's new tokens, request after request;
// k_cache, v_cache (KVH, slots, D); out_cache_loc (T,) int64 slots of the new tokens;
// req_to_token (rows, ctx) int64; req_pool_indices, prefix_lens, extend_lens (B,) int64 (decode:
// extend_lens all 1); cascade_reqs (N,), cascade_offsets (G + 1,), cascade_lens (G,) int64: shared-prefix
// groups (all empty for none; see cascade_key_begin). Returns (T, H, D) in q's dtype. Raises on mismatched shapes/dtypes and on
// slots or lengths outside the pools.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                           at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& out_cache_loc,
                           const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                           const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                           const at::Tensor& cascade_reqs, const at::Tensor& cascade_offsets,
                           const at::Tensor& cascade_lens, double scaling) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() && req_to_token.is_contiguous(),
              "tensors must be contiguous");
  TORCH_CHECK(k_new.dim() == 3 && v_new.dim() == 3 && k_new.stride(2) == 1 && v_new.stride(2) == 1,
              "k_new and v_new must be (T, KVH, D) with unit stride in D");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && k_new.scalar_type() == k_cache.scalar_type() &&
              v_new.scalar_type() == k_cache.scalar_type(), "q, k, v and the KV pool must share a dtype");
  for (const at::Tensor* t : {&out_cache_loc, &req_to_token, &req_pool_indices, &prefix_lens, &extend_lens,
                              &cascade_reqs, &cascade_offsets, &cascade_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "index tensors must be contiguous int64");
  }
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2), kvh = k_cache.size(0);
  const int64_t bs = req_pool_indices.numel();
  TORCH_CHECK(k_cache.size(2) == d && heads % kvh == 0, "head shapes do not match");
  TORCH_CHECK(k_new.size(0) == tokens && k_new.size(1) == kvh && k_new.size(2) == d && v_new.sizes() == k_new.sizes() &&
              out_cache_loc.numel() == tokens && prefix_lens.numel() == bs && extend_lens.numel() == bs,
              "batch shapes do not match");
  at::Tensor out = at::empty_like(q);
  const int64_t* loc = out_cache_loc.data_ptr<int64_t>();
  switch (q.scalar_type()) {
    case at::kFloat: run<float>(q, k_new, v_new, k_cache, v_cache, loc, req_to_token, req_pool_indices, prefix_lens, extend_lens, cascade_reqs, cascade_offsets, cascade_lens, scaling, out); break;
    case at::kBFloat16: run<at::BFloat16>(q, k_new, v_new, k_cache, v_cache, loc, req_to_token, req_pool_indices, prefix_lens, extend_lens, cascade_reqs, cascade_offsets, cascade_lens, scaling, out); break;
    case at::kHalf: run<at::Half>(q, k_new, v_new, k_cache, v_cache, loc, req_to_token, req_pool_indices, prefix_lens, extend_lens, cascade_reqs, cascade_offsets, cascade_lens, scaling, out); break;
    default: TORCH_CHECK(false, "paged_attention supports float32, bfloat16 and float16, not ", q.scalar_type());
  }
  return out;
}

// Whether bf16 pools of this head_dim run on the pair tile path's AVX512-BF16 engine here (dpbf16_attention.h).
bool attention_bf16_pairs(int64_t head_dim) { return use_dp_attention(head_dim); }

// Whether bf16 pools of this head_dim run on the AMX path here (AMX-BF16: see amx_attention.h).
bool attention_bf16_amx(int64_t head_dim) { return use_amx_attention(head_dim); }

}  // namespace

TORCH_LIBRARY(radixlm_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor out_cache_loc, Tensor req_to_token, Tensor req_pool_indices, Tensor prefix_lens, Tensor extend_lens, "
        "Tensor cascade_reqs, Tensor cascade_offsets, Tensor cascade_lens, float scaling) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, &paged_attention);
  m.def("attention_bf16_pairs(int head_dim) -> bool", &attention_bf16_pairs);
  m.def("attention_bf16_amx(int head_dim) -> bool", &attention_bf16_amx);
}
