// Row-wise argmax of fp32 or bf16 logits (CPU): greedy decoding's token choice, torch.argmax(x, -1) exactly.
//
// torch's CPU argmax over the vocabulary runs a scalar reduction (~1 GB/s: ~3 ms for a batch of 64
// rows of 49,152 logits, a few % of a decode step); here a row is scanned twice with 16-lane vectors:
// its maximum (a NaN propagates), then the first index holding it. The result is torch's: the first
// index of the row's maximum, a NaN counting as larger than everything (the first NaN wins), -0.0
// and +0.0 equal.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include "../../gemm/cpu/work_stealing.h"
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <utility>

namespace {

using Vec = at::vec::Vectorized<float>;

// x[i] as a float (exact for bf16: its top 16 bits).
inline float at_f(const float* x, int64_t i) { return x[i]; }
inline float at_f(const at::BFloat16* x, int64_t i) { return static_cast<float>(x[i]); }

// Elements [i, i + 2W) as two float vectors (bf16 widened exactly, so every comparison below sees the
// same values torch.argmax compares).
inline std::pair<Vec, Vec> load2(const float* x, int64_t i) {
  return {Vec::loadu(x + i), Vec::loadu(x + i + Vec::size())};
}
inline std::pair<Vec, Vec> load2(const at::BFloat16* x, int64_t i) {
  auto [lo, hi] = at::vec::convert_to_float<at::BFloat16>(at::vec::Vectorized<at::BFloat16>::loadu(x + i));
  return {lo, hi};
}

template <typename T>
int64_t row_argmax(const T* x, int64_t n) {
  constexpr int64_t W = Vec::size();
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
  if (n >= 4 * W) {  // four accumulators: independent max chains
    auto [a0, a1] = load2(x, 0);
    auto [a2, a3] = load2(x, 2 * W);
    for (i = 4 * W; i + 4 * W <= n; i += 4 * W) {
      const auto [b0, b1] = load2(x, i);
      const auto [b2, b3] = load2(x, i + 2 * W);
      a0 = at::vec::maximum(a0, b0);
      a1 = at::vec::maximum(a1, b1);
      a2 = at::vec::maximum(a2, b2);
      a3 = at::vec::maximum(a3, b3);
    }
    const Vec a = at::vec::maximum(at::vec::maximum(a0, a1), at::vec::maximum(a2, a3));
    m = at::vec::vec_reduce_all<float>([](const Vec& p, const Vec& q) { return at::vec::maximum(p, q); }, a);
  }
  for (; i < n; ++i) {
    const float v = at_f(x, i);
    m = std::isnan(v) || std::isnan(m) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, v);
  }
  if (std::isnan(m)) {
    for (int64_t j = 0; j < n; ++j) {
      if (std::isnan(at_f(x, j))) return j;
    }
  }
  int64_t j = 0;
  const Vec vm(m);
  for (; j + 2 * W <= n; j += 2 * W) {
    const auto [v0, v1] = load2(x, j);
    if ((v0 == vm).zero_mask() != (1 << W) - 1 || (v1 == vm).zero_mask() != (1 << W) - 1) {  // a lane equal
      for (int64_t k = j; k < j + 2 * W; ++k) {
        if (at_f(x, k) == m) return k;
      }
    }
  }
  for (; j < n; ++j) {
    if (at_f(x, j) == m) return j;
  }
  return 0;  // unreachable for n >= 1
}

template <typename T>
void argmax_rows_of(const at::Tensor& logits, at::Tensor& out) {
  const int64_t rows = logits.size(0), n = logits.size(1), ld = logits.stride(0);
  const T* x = logits.data_ptr<T>();
  int64_t* o = out.data_ptr<int64_t>();
  radixlm_parallel::parallel_for_steal(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = row_argmax(x + r * ld, n);
  });
}

// logits (rows, V) float32 or bfloat16 with unit stride along V, V >= 1. Returns (rows,) int64. Raises
// on other shapes or dtypes. A bf16 row gives the index its exact fp32 widening gives (torch.argmax's
// on either).
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) >= 1, "argmax_rows expects (rows, V >= 1) logits");
  const bool bf16 = logits.scalar_type() == at::kBFloat16;
  TORCH_CHECK((logits.scalar_type() == at::kFloat || bf16) && logits.stride(1) == 1,
              "argmax_rows expects float32 or bfloat16 rows of unit stride");
  at::Tensor out = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  if (bf16) argmax_rows_of<at::BFloat16>(logits, out);
  else argmax_rows_of<float>(logits, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("argmax_rows(Tensor logits) -> Tensor");
  m.impl("argmax_rows", c10::DispatchKey::CPU, &argmax_rows);
}
