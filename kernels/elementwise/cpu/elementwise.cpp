// Fused elementwise ops of a decoder layer (CPU), one pass over memory and one parallel region each,
// as SGLang's sgl-kernel CPU ops (fused_add_rmsnorm, rotary embedding, silu_and_mul) and vLLM-CPU's:
//
//   add_rms_norm_(h, delta, w, eps): h += delta (in place; delta may be undefined), returns
//       w * h / sqrt(mean(h^2) + eps) with the norm in fp32 (Zhang & Sennrich 2019; HF LlamaRMSNorm);
//   rope(q, k, cos, sin): q * cos + rotate_half(q) * sin (Su et al. 2021, HF's rotate-half layout) for
//       q and k, into new contiguous tensors;
//   silu_and_mul(x): silu(x[:, :I]) * x[:, I:] (SwiGLU, Shazeer 2020).
//
// Rounding follows the torch reference ops step by step (each product and sum rounded to the tensor
// dtype where torch rounds it, the norm's statistics in fp32), so results equal the reference up
// to the order of the fp32 sum of squares (and exactly for rope and silu_and_mul in fp32).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include "../../gemm/cpu/work_stealing.h"
#include "bf16_rows_avx512.h"
#include "silu_mul_avx512.h"
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <cmath>

namespace {

using Vec = at::vec::Vectorized<float>;

template <typename T>
inline float to_f(T x) { return static_cast<float>(x); }

// Rounds an fp32 value to T and back (torch's intermediate rounding in T).
template <typename T>
inline float round_to(float x) { return static_cast<float>(static_cast<T>(x)); }

// bf16 / fp16 rows, vectorized: a Vectorized<T> holds two fp32 vectors' worth; conversions widen
// exactly and round to nearest even, as the scalar static_casts do.
template <typename T>
using HVec = at::vec::Vectorized<T>;

template <typename T>
inline std::tuple<Vec, Vec> load_wide(const T* p) { return at::vec::convert_to_float<T>(HVec<T>::loadu(p)); }

// Rounds two fp32 vectors to T and back (round_to, 2 x Vec::size() lanes).
template <typename T>
inline std::tuple<Vec, Vec> round_wide(const Vec& a, const Vec& b) {
  return at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(a, b));
}

template <typename T>
void add_rms_norm_impl(at::Tensor& h, const at::Tensor& delta, const at::Tensor& w, double eps, at::Tensor& out) {
  const int64_t rows = h.size(0), n = h.size(1);
  T* hp = h.data_ptr<T>();
  const T* dp = delta.defined() ? delta.data_ptr<T>() : nullptr;
  const T* wp = w.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t hs = h.stride(0), ds = delta.defined() ? delta.stride(0) : 0;
  radixlm_parallel::parallel_for_steal(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* x = hp + r * hs;
#ifdef CPU_CAPABILITY_AVX512
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        if (n % 32 == 0) {  // bf16_rows_avx512.h: the same bits (NaN payloads aside), cheaper roundings
          radixlm_math::add_rms_norm_row_bf16(x, dp != nullptr ? dp + r * ds : nullptr, wp, op + r * n, n,
                                              static_cast<float>(eps));
          continue;
        }
      }
#endif
      if (dp != nullptr) {
        const T* d = dp + r * ds;
        if constexpr (std::is_same_v<T, float>) {
          int64_t i = 0;
          for (; i + Vec::size() <= n; i += Vec::size()) (Vec::loadu(x + i) + Vec::loadu(d + i)).store(x + i);
          for (; i < n; ++i) x[i] = x[i] + d[i];
        } else {
          int64_t i = 0;
          for (; i + HVec<T>::size() <= n; i += HVec<T>::size()) {
            auto [xa, xb] = load_wide(x + i);
            auto [da, db] = load_wide(d + i);
            at::vec::convert_from_float<T>(xa + da, xb + db).store(x + i);
          }
          for (; i < n; ++i) x[i] = static_cast<T>(to_f(x[i]) + to_f(d[i]));
        }
      }
      float ss = 0.f;
      int64_t i = 0;
      if constexpr (std::is_same_v<T, float>) {
        Vec acc(0.f);
        for (; i + Vec::size() <= n; i += Vec::size()) {
          const Vec v = Vec::loadu(x + i);
          acc = at::vec::fmadd(v, v, acc);
        }
        ss = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, acc);
      } else {
        Vec acc(0.f);
        for (; i + HVec<T>::size() <= n; i += HVec<T>::size()) {
          auto [va, vb] = load_wide(x + i);
          acc = at::vec::fmadd(vb, vb, at::vec::fmadd(va, va, acc));
        }
        ss = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, acc);
      }
      for (; i < n; ++i) ss += to_f(x[i]) * to_f(x[i]);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      T* o = op + r * n;
      if constexpr (std::is_same_v<T, float>) {
        const Vec vinv(inv);
        int64_t j = 0;
        for (; j + Vec::size() <= n; j += Vec::size()) {
          (Vec::loadu(wp + j) * (Vec::loadu(x + j) * vinv)).store(o + j);
        }
        for (; j < n; ++j) o[j] = wp[j] * (x[j] * inv);
      } else {
        // torch: (x.float() * inv).to(T), then w * that in T
        const Vec vinv(inv);
        int64_t j = 0;
        for (; j + HVec<T>::size() <= n; j += HVec<T>::size()) {
          auto [xa, xb] = load_wide(x + j);
          auto [wa, wb] = load_wide(wp + j);
          auto [ya, yb] = round_wide<T>(xa * vinv, xb * vinv);
          at::vec::convert_from_float<T>(wa * ya, wb * yb).store(o + j);
        }
        for (; j < n; ++j) o[j] = static_cast<T>(to_f(wp[j]) * round_to<T>(to_f(x[j]) * inv));
      }
    }
  });
}

// h (R, N) with unit stride in N; delta (R, N) or undefined; w (N,). Returns (R, N) contiguous.
at::Tensor add_rms_norm_(at::Tensor h, const c10::optional<at::Tensor>& delta_opt, const at::Tensor& w, double eps) {
  TORCH_CHECK(h.dim() == 2 && h.stride(1) == 1, "add_rms_norm_: h must be (rows, hidden) with unit inner stride");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == h.size(1) && w.is_contiguous() && w.scalar_type() == h.scalar_type(),
              "add_rms_norm_: weight must be (hidden,) contiguous in h's dtype");
  at::Tensor delta = delta_opt.has_value() ? *delta_opt : at::Tensor();
  if (delta.defined()) {
    TORCH_CHECK(delta.sizes() == h.sizes() && delta.stride(1) == 1 && delta.scalar_type() == h.scalar_type(),
                "add_rms_norm_: delta must match h");
  }
  at::Tensor out = at::empty(h.sizes(), h.options());
  switch (h.scalar_type()) {
    case at::kFloat: add_rms_norm_impl<float>(h, delta, w, eps, out); break;
    case at::kBFloat16: add_rms_norm_impl<at::BFloat16>(h, delta, w, eps, out); break;
    case at::kHalf: add_rms_norm_impl<at::Half>(h, delta, w, eps, out); break;
    default: TORCH_CHECK(false, "add_rms_norm_ supports float32, bfloat16 and float16, not ", h.scalar_type());
  }
  return out;
}

// One head row: out = x * cos + rotate_half(x) * sin, each product and the sum rounded to T.
template <typename T>
inline void rope_row(const T* x, const T* c, const T* s, T* o, int64_t d) {
  const int64_t half = d / 2;
  if constexpr (std::is_same_v<T, float>) {
    int64_t i = 0;
    for (; i + Vec::size() <= half; i += Vec::size()) {
      const Vec x1 = Vec::loadu(x + i), x2 = Vec::loadu(x + half + i);
      (x1 * Vec::loadu(c + i) + x2.neg() * Vec::loadu(s + i)).store(o + i);
      (x2 * Vec::loadu(c + half + i) + x1 * Vec::loadu(s + half + i)).store(o + half + i);
    }
    for (; i < half; ++i) {
      o[i] = x[i] * c[i] + (-x[half + i]) * s[i];
      o[half + i] = x[half + i] * c[half + i] + x[i] * s[half + i];
    }
  } else {
    int64_t i = 0;
    for (; i + HVec<T>::size() <= half; i += HVec<T>::size()) {  // bf16 x bf16 products are exact in fp32
      auto [x1a, x1b] = load_wide(x + i);
      auto [x2a, x2b] = load_wide(x + half + i);
      auto [c1a, c1b] = load_wide(c + i);
      auto [c2a, c2b] = load_wide(c + half + i);
      auto [s1a, s1b] = load_wide(s + i);
      auto [s2a, s2b] = load_wide(s + half + i);
      auto [pa, pb] = round_wide<T>(x1a * c1a, x1b * c1b);
      auto [qa, qb] = round_wide<T>(x2a.neg() * s1a, x2b.neg() * s1b);
      at::vec::convert_from_float<T>(pa + qa, pb + qb).store(o + i);
      auto [ra, rb] = round_wide<T>(x2a * c2a, x2b * c2b);
      auto [ta, tb] = round_wide<T>(x1a * s2a, x1b * s2b);
      at::vec::convert_from_float<T>(ra + ta, rb + tb).store(o + half + i);
    }
    for (; i < half; ++i) {
      o[i] = static_cast<T>(round_to<T>(to_f(x[i]) * to_f(c[i])) + round_to<T>(-to_f(x[half + i]) * to_f(s[i])));
      o[half + i] = static_cast<T>(round_to<T>(to_f(x[half + i]) * to_f(c[half + i])) +
                                   round_to<T>(to_f(x[i]) * to_f(s[half + i])));
    }
  }
}

#ifdef CPU_CAPABILITY_AVX512
// bf16 q and k with head_dim % 32 == 0 in one parallel region over the tokens (bf16_rows_avx512.h: the
// same bits as rope_row but for NaN payloads, a token's cos / sin widened once for all its heads).
void rope_bf16_avx512(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                      at::Tensor& qo, at::Tensor& ko) {
  using BF = at::BFloat16;
  const int64_t tokens = q.size(0), hq = q.size(1), hk = k.size(1), d = q.size(2);
  const BF* qp = q.data_ptr<BF>();
  const BF* kp = k.data_ptr<BF>();
  const BF* cp = cos.data_ptr<BF>();
  const BF* sp = sin.data_ptr<BF>();
  BF* qop = qo.data_ptr<BF>();
  BF* kop = ko.data_ptr<BF>();
  radixlm_parallel::parallel_for_steal(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      radixlm_math::rope_token_bf16(qp + t * q.stride(0), q.stride(1), hq, cp + t * d, sp + t * d, qop + t * hq * d, d);
      radixlm_math::rope_token_bf16(kp + t * k.stride(0), k.stride(1), hk, cp + t * d, sp + t * d, kop + t * hk * d, d);
    }
  });
}
#endif

template <typename T>
void rope_impl(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  const T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  radixlm_parallel::parallel_for_steal(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        rope_row<T>(xp + t * s0 + h * s1, cp + t * d, sp + t * d, op + (t * heads + h) * d, d);
      }
    }
  });
}

// q (T, H, D), k (T, KVH, D) with unit stride in D (views into a fused qkv output are fine);
// cos, sin (T, D) contiguous, in q's dtype. Returns (q_out, k_out), contiguous.
std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                        const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1, "rope: q, k must be (T, heads, D)");
  const int64_t tokens = q.size(0), d = q.size(2);
  TORCH_CHECK(k.size(0) == tokens && k.size(2) == d && d % 2 == 0, "rope: q and k shapes do not match");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == tokens && cos.size(1) == d && cos.is_contiguous() &&
              sin.sizes() == cos.sizes() && sin.is_contiguous(), "rope: cos, sin must be (T, D) contiguous");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && cos.scalar_type() == q.scalar_type() &&
              sin.scalar_type() == q.scalar_type(), "rope: q, k, cos and sin must share a dtype");
  at::Tensor qo = at::empty(q.sizes(), q.options()), ko = at::empty(k.sizes(), k.options());
  switch (q.scalar_type()) {
    case at::kFloat: rope_impl<float>(q, cos, sin, qo); rope_impl<float>(k, cos, sin, ko); break;
    case at::kBFloat16:
#ifdef CPU_CAPABILITY_AVX512
      if (d % 32 == 0) {
        rope_bf16_avx512(q, k, cos, sin, qo, ko);
        break;
      }
#endif
      rope_impl<at::BFloat16>(q, cos, sin, qo);
      rope_impl<at::BFloat16>(k, cos, sin, ko);
      break;
    case at::kHalf: rope_impl<at::Half>(q, cos, sin, qo); rope_impl<at::Half>(k, cos, sin, ko); break;
    default: TORCH_CHECK(false, "rope supports float32, bfloat16 and float16, not ", q.scalar_type());
  }
  return {qo, ko};
}

template <typename T>
void silu_and_mul_impl(const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = x.size(0), n = out.size(1);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t xs = x.stride(0);
  radixlm_parallel::parallel_for_steal(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = xp + r * xs;
      const T* u = g + n;
      T* o = op + r * n;
      if constexpr (std::is_same_v<T, float>) {
        // Two vectors per step and the rest scalar, as torch's vectorized_loop splits a row: the
        // vector exp (Sleef) and std::exp differ in the last bit, so the split must match F.silu's.
        const Vec one(1.f);
        int64_t i = 0;
        for (; i + 2 * Vec::size() <= n; i += 2 * Vec::size()) {
          for (int64_t j = i; j < i + 2 * Vec::size(); j += Vec::size()) {
            const Vec gv = Vec::loadu(g + j);
            ((gv / (one + gv.neg().exp())) * Vec::loadu(u + j)).store(o + j);
          }
        }
        for (; i < n; ++i) o[i] = (g[i] / (1.f + std::exp(-g[i]))) * u[i];
      } else {
        // silu in fp32, rounded to T, times up in fp32, rounded to T (torch's two bf16 ops)
        int64_t i = 0;
#ifdef CPU_CAPABILITY_AVX512
        if constexpr (std::is_same_v<T, at::BFloat16>) {
          // silu_mul_avx512.h: exp2-based SiLU, a few fp32 ulps from the reference's before the bf16
          // rounding, at ~1/3 of Sleef's expf; the same bits as the fused gate-up linear (swiglu.cpp).
          for (; i + 16 <= n; i += 16) radixlm_math::silu_mul_bf16x16(g + i, u + i, o + i);
        }
#endif
        const Vec one(1.f);
        for (; i + HVec<T>::size() <= n; i += HVec<T>::size()) {
          auto [ga, gb] = load_wide(g + i);
          auto [ua, ub] = load_wide(u + i);
          auto [sa, sb] = round_wide<T>(ga / (one + ga.neg().exp()), gb / (one + gb.neg().exp()));
          at::vec::convert_from_float<T>(sa * ua, sb * ub).store(o + i);
        }
        for (; i < n; ++i) {
          const float gv = to_f(g[i]);
          o[i] = static_cast<T>(round_to<T>(gv / (1.f + std::exp(-gv))) * to_f(u[i]));
        }
      }
    }
  });
}

// x (R, 2I) with unit inner stride. Returns (R, I) contiguous.
at::Tensor silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0, "silu_and_mul: x must be (rows, 2 * I)");
  at::Tensor out = at::empty({x.size(0), x.size(1) / 2}, x.options());
  switch (x.scalar_type()) {
    case at::kFloat: silu_and_mul_impl<float>(x, out); break;
    case at::kBFloat16: silu_and_mul_impl<at::BFloat16>(x, out); break;
    case at::kHalf: silu_and_mul_impl<at::Half>(x, out); break;
    default: TORCH_CHECK(false, "silu_and_mul supports float32, bfloat16 and float16, not ", x.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("add_rms_norm_(Tensor(a!) h, Tensor? delta, Tensor weight, float eps) -> Tensor");
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.impl("add_rms_norm_", c10::DispatchKey::CPU, &add_rms_norm_);
  m.impl("rope", c10::DispatchKey::CPU, &rope);
  m.impl("silu_and_mul", c10::DispatchKey::CPU, &silu_and_mul);
}
