// Paged causal attention over an HND KV pool for a whole batch in one call per layer (CPU):
// extend (prefill, prefill chunks after a cached prefix) and decode (one query per request) alike.
//
// Each request's query rows attend over its KV slots, listed by its req_to_token row (SGLang's
// req_to_token / FlashInfer's paged-KV indices). The new tokens' K/V are written into the pool first
// (KVPool.set_kv), so one call does the store and the attention.
//
// Work items are (request, KV head, tile of up to TILE query rows), run in torch's OpenMP pool
// (at::parallel_for, so the thread count and wait policy are the process's). An item computes the
// rows x G (= H / KVH) query vectors that share the KV head, so a K/V row is loaded once for all of
// them, in blocks of BLOCK keys:
// scores = q . k (fp32), a running max and normaliser per head (online softmax, Milakov & Gimelshein
// 2018; FlashDecoding), then acc += p * v. K/V may be fp32, bf16 or fp16; arithmetic is fp32.
// Vectorised with ATen's at::vec (AVX2 / AVX-512 chosen by the CPU_CAPABILITY macros at build time);
// exp is Sleef's 1-ulp expf, as torch's own softmax uses.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t BLOCK = 128;   // keys per softmax block
constexpr int64_t TILE = 16;     // query rows of one request per work item (they share K/V loads)

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

inline float dot(const float* a, const float* b, int64_t d) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= d; i += Vec::size()) {
    acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  }
  float s = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float* y, float a, const float* x, int64_t d) {  // y += a * x
  const Vec va(a);
  int64_t i = 0;
  for (; i + Vec::size() <= d; i += Vec::size()) {
    at::vec::fmadd(va, Vec::loadu(x + i), Vec::loadu(y + i)).store(y + i);
  }
  for (; i < d; ++i) y[i] += a * x[i];
}

inline void scale(float* y, float a, int64_t d) {
  const Vec va(a);
  int64_t i = 0;
  for (; i + Vec::size() <= d; i += Vec::size()) (Vec::loadu(y + i) * va).store(y + i);
  for (; i < d; ++i) y[i] *= a;
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
  float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  return sum;
}

template <typename T>
void store_kv(at::Tensor& cache, const at::Tensor& src, const int64_t* loc, int64_t tokens) {
  // cache (KVH, slots, D); src (T, KVH, D)
  const int64_t kvh = cache.size(0), slots = cache.size(1), d = cache.size(2);
  T* dst = cache.data_ptr<T>();
  const T* s = src.data_ptr<T>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < kvh; ++h) {
      std::copy(s + (t * kvh + h) * d, s + (t * kvh + h + 1) * d, dst + (h * slots + loc[t]) * d);
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

// Attention of query rows [row0, row0 + rows) of request b over KV head h. Row i of the request sits
// at position prefix + i and sees keys [0, prefix + i]. Every row runs the same sequence of
// operations whatever tile, batch or step it is in (key blocks at multiples of BLOCK, the same
// reductions), so a token's output is bitwise the same in a prefill, a prefill chunk, a decode step
// or any batch: the kernel is batch-invariant and extend/decode-consistent by construction.
template <typename T>
void attend_item(const Item& it, const T* qp, const T* kp, const T* vp, const int64_t* slot_row, int64_t prefix,
                 int64_t q_row0, int64_t heads, int64_t group, int64_t d, int64_t slots, float scaling, T* op,
                 std::vector<float>& qf, std::vector<float>& acc, std::vector<float>& kblock,
                 std::vector<float>& vblock, std::vector<float>& scores, std::vector<float>& m, std::vector<float>& l) {
  const int64_t nq = it.rows * group;  // query vectors in this item
  for (int64_t r = 0; r < it.rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const T* src = qp + ((q_row0 + it.row0 + r) * heads + it.h * group + g) * d;
      float* dst = qf.data() + (r * group + g) * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(src[i]) * scaling;
    }
  }
  std::fill(m.begin(), m.begin() + nq, -std::numeric_limits<float>::infinity());
  std::fill(l.begin(), l.begin() + nq, 0.f);
  std::fill(acc.begin(), acc.begin() + nq * d, 0.f);
  const T* kh = kp + it.h * slots * d;
  const T* vh = vp + it.h * slots * d;
  const int64_t last_len = prefix + it.row0 + it.rows;  // keys seen by the item's last row
  for (int64_t j0 = 0; j0 < last_len; j0 += BLOCK) {
    const int64_t nblock = std::min(BLOCK, last_len - j0);
    const float* krows[BLOCK];
    const float* vrows[BLOCK];
    for (int64_t j = 0; j < nblock; ++j) {
      const int64_t slot = slot_row[j0 + j];
      krows[j] = as_float<T>(kh + slot * d, kblock.data() + j * d, d);
      vrows[j] = as_float<T>(vh + slot * d, vblock.data() + j * d, d);
    }
    for (int64_t r = 0; r < it.rows; ++r) {
      const int64_t len = prefix + it.row0 + r + 1;
      if (len <= j0) continue;
      const int64_t n = std::min(BLOCK, len - j0);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t qi = r * group + g;
        const float* qv = qf.data() + qi * d;
        float* s = scores.data();
        for (int64_t j = 0; j < n; ++j) s[j] = dot(qv, krows[j], d);
        const float bmax = *std::max_element(s, s + n);
        const float mnew = std::max(m[qi], bmax);
        float* a = acc.data() + qi * d;
        if (m[qi] != -std::numeric_limits<float>::infinity() && mnew != m[qi]) {
          const float corr = std::exp(m[qi] - mnew);
          l[qi] *= corr;
          scale(a, corr, d);
        }
        m[qi] = mnew;
        l[qi] += exp_sub_sum(s, mnew, n);
        for (int64_t j = 0; j < n; ++j) axpy(a, s[j], vrows[j], d);
      }
    }
  }
  for (int64_t r = 0; r < it.rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t qi = r * group + g;
      T* dst = op + ((q_row0 + it.row0 + r) * heads + it.h * group + g) * d;
      const float inv = 1.f / l[qi];
      for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<T>(acc[qi * d + i] * inv);
    }
  }
}

template <typename T>
void attention_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                      const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scaling, at::Tensor& out) {
  const int64_t bs = req_pool_indices.numel(), heads = q.size(1), d = q.size(2);
  const int64_t kvh = k_cache.size(0), slots = k_cache.size(1);
  const int64_t group = heads / kvh;
  const int64_t ctx = req_to_token.size(1);
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t* rows = req_pool_indices.data_ptr<int64_t>();
  const int64_t* pre = prefix_lens.data_ptr<int64_t>();
  const int64_t* ext = extend_lens.data_ptr<int64_t>();
  const std::vector<int64_t> q_start = query_starts(q.size(0), ctx, prefix_lens, extend_lens);
  // Items of at most TILE query rows; assigned to threads longest-first onto the least-loaded
  // thread (LPT), so long prefills do not leave a thread idle.
  std::vector<Item> items;
  for (int64_t b = 0; b < bs; ++b) {
    for (int64_t h = 0; h < kvh; ++h) {
      for (int64_t r0 = 0; r0 < ext[b]; r0 += TILE) {
        const int64_t n = std::min(TILE, ext[b] - r0);
        items.push_back({b, h, r0, n, n * (pre[b] + r0 + n) + 64});
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
  at::parallel_for(0, nthreads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(TILE * group * d), acc(TILE * group * d), kblock(BLOCK * d), vblock(BLOCK * d),
        scores(BLOCK), m(TILE * group), l(TILE * group);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t i : assigned[t]) {
        const Item& it = items[i];
        attend_item<T>(it, qp, kp, vp, table + rows[it.b] * ctx, pre[it.b], q_start[it.b], heads, group, d, slots,
                       static_cast<float>(scaling), op, qf, acc, kblock, vblock, scores, m, l);
      }
    }
  });
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, at::Tensor& k_cache,
         at::Tensor& v_cache, const int64_t* loc, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
         const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scaling, at::Tensor& out) {
  query_starts(q.size(0), req_to_token.size(1), prefix_lens, extend_lens);  // validate before writing the pool
  for (int64_t b = 0; b < req_pool_indices.numel(); ++b) {
    const int64_t row = req_pool_indices.data_ptr<int64_t>()[b];
    TORCH_CHECK(row >= 0 && row < req_to_token.size(0), "req_pool_indices[", b, "] = ", row, " outside req_to_token");
  }
  const int64_t slots = k_cache.size(1);
  for (int64_t t = 0; t < q.size(0); ++t) {
    TORCH_CHECK(loc[t] >= 0 && loc[t] < slots, "out_cache_loc ", loc[t], " outside the KV pool of ", slots, " slots");
  }
  store_kv<T>(k_cache, k_new, loc, q.size(0));
  store_kv<T>(v_cache, v_new, loc, q.size(0));
  attention_kernel<T>(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, scaling, out);
}

// q (T, H, D); k_new, v_new (T, KVH, D): the batch's new tokens, request after request;
// k_cache, v_cache (KVH, slots, D); out_cache_loc (T,) int64 slots of the new tokens;
// req_to_token (rows, ctx) int64; req_pool_indices, prefix_lens, extend_lens (B,) int64 (decode:
// extend_lens all 1). Returns (T, H, D) in q's dtype. Raises on mismatched shapes/dtypes and on
// slots or lengths outside the pools.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                           at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& out_cache_loc,
                           const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                           const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scaling) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK(q.is_contiguous() && k_new.is_contiguous() && v_new.is_contiguous() && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && req_to_token.is_contiguous(), "tensors must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && k_new.scalar_type() == k_cache.scalar_type() &&
              v_new.scalar_type() == k_cache.scalar_type(), "q, k, v and the KV pool must share a dtype");
  for (const at::Tensor* t : {&out_cache_loc, &req_to_token, &req_pool_indices, &prefix_lens, &extend_lens}) {
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
    case at::kFloat: run<float>(q, k_new, v_new, k_cache, v_cache, loc, req_to_token, req_pool_indices, prefix_lens, extend_lens, scaling, out); break;
    case at::kBFloat16: run<at::BFloat16>(q, k_new, v_new, k_cache, v_cache, loc, req_to_token, req_pool_indices, prefix_lens, extend_lens, scaling, out); break;
    case at::kHalf: run<at::Half>(q, k_new, v_new, k_cache, v_cache, loc, req_to_token, req_pool_indices, prefix_lens, extend_lens, scaling, out); break;
    default: TORCH_CHECK(false, "paged_attention supports float32, bfloat16 and float16, not ", q.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(radixlm_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor out_cache_loc, Tensor req_to_token, Tensor req_pool_indices, Tensor prefix_lens, Tensor extend_lens, "
        "float scaling) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, &paged_attention);
}
