// Linear layer over panel-packed weights (CPU): y = x W^T (+ b), the register-blocked microkernel
// scheme of BLIS / GotoBLAS (Goto & van de Geijn 2008; Van Zee & van de Geijn 2015).
//
//   pack_linear_weight(w (N, K) fp32 or bf16) -> (N / PW, K, PW) with PW = 16 (or 8, 4, 2, 1 when N is
//       not a multiple of 16): panel p holds rows PW*p .. PW*p + PW - 1 of w, k-major, so the
//       microkernel reads the PW output columns of one k as contiguous 8-float vectors;
//   linear_packed(x (M, K), w_packed, bias?) -> (M, N), x, bias and y in the weight's dtype.
//
// bf16: weights and activations are widened to fp32 exactly (a bf16 is the top half of an fp32),
// the chains accumulate in fp32 and the result is rounded to bf16 once (round-to-nearest-even, as
// torch rounds), after the bias add in fp32. On CPUs with AVX512-BF16 the weight is packed in pair
// panels instead (bf16_dot.h) and multiplied with vdpbf16ps in 8-row x 48-column tiles over packed
// activations (bf16_packed_avx512.h): the same rounding, twice the rate. With AMX-BF16 the same pair
// panels are B tiles, multiplied with TDPBF16PS (bf16_amx.h) where K is a multiple of 32.
//
// The microkernel keeps a tile of R (<= 6) rows x 16 columns in 12 AVX2 registers (AVX-512: R <= 12
// rows in 12 zmm registers, the same chains; 8-wide panels: 6;
// narrower ones run the same chains in scalar code) and runs the K
// loop as FMAs of a broadcast x[m, k] with the panel's two vectors for k. Each output element is
// one FMA chain over k = 0 .. K-1 in order, whatever M, the tile a row falls in or the thread that
// computes it: a row's result does not depend on the batch around it (bitwise), which is what
// batch-invariant ("deterministic") inference needs. The bias is added after the chain.
//
// fp32 at 512-bit width runs fp32_packed_avx512.h instead: 8-row x 48-column tiles over a packed copy
// of the activations, K in blocks of 128 (the same chains, so the same bits; ~1.4-2x the 12 x 16
// tile on an Ice Lake Xeon, where that tile is load-bound).
//
// Work split: rows in blocks of up to 96 (a block of x stays in L2 while every panel streams past
// it once), panels across threads (work_stealing.h). Without AVX2 the same chains run as scalar
// std::fma loops (identical results).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "bf16_dot.h"
#include "microkernel.h"
#ifdef CPU_CAPABILITY_AVX512
#include "bf16_packed_avx512.h"
#include "bf16_amx.h"
#include "fp32_packed_avx512.h"
#endif

namespace {

using namespace radixlm_gemm;

template <typename T>
void linear_impl(const at::Tensor& xc, const at::Tensor& w, const T* bp, at::Tensor& y) {
  const int64_t M = xc.size(0), K = xc.size(1), panels = w.size(0), pw = w.size(2), N = panels * pw;
  const T* xp = xc.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const int64_t ldx = xc.stride(0);
#ifdef CPU_CAPABILITY_AVX512
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (use_bf16_amx(K, pw)) return linear_pairs_bf16_amx(xp, ldx, M, wp, N, K, bp, yp);  // bf16_amx.h
    if (use_bf16_pairs(K, pw)) return linear_pairs_bf16_avx512(xp, ldx, M, wp, N, K, bp, yp);  // bf16_packed_avx512.h
  }
  if constexpr (std::is_same_v<T, float>) {
    if (pw == 16) return linear_packed_fp32_avx512(xp, ldx, M, wp, N, K, bp, yp);  // fp32_packed_avx512.h
  }
#endif
  // Rows per pass over the panels: as many as ~384 KB of x (in L2 while each panel passes), at least
  // kRowBlock: a decode batch of up to ~160 rows at K = 576 streams every weight from memory once.
  const int64_t row_block = std::max<int64_t>(kRowBlock, (384 << 10) / (K * static_cast<int64_t>(sizeof(T))) / 6 * 6);
  for (int64_t m0 = 0; m0 < M; m0 += row_block) {
    const int64_t m1 = std::min(M, m0 + row_block);
    radixlm_parallel::parallel_for_steal(0, panels, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const T* b = bp != nullptr ? bp + p * pw : nullptr;
        const T* next = p + 1 < panels ? wp + (p + 1) * K * pw : nullptr;  // a share's next panel (stolen: wasted)
        panel_rows<T>(xp, ldx, m0, m1, wp + p * K * pw, pw, K, yp + p * pw, N, b, next,
                      static_cast<int64_t>(K * pw * sizeof(T)));
      }
    });
  }
}

at::Tensor pack_linear_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "pack_linear_weight: expected a 2-D float32 or bfloat16 weight");
  const int64_t N = w.size(0), K = w.size(1), pw = panel_width(N);
  if (w.scalar_type() == at::kBFloat16 && use_bf16_pairs(K, pw)) {
    // (N, K) -> (N/16, 16, K/2, 2) -> (N/16, K/2, 16, 2), viewed as (N/16, K, 16): bf16_dot.h's pair panels
    return w.contiguous().view({N / pw, pw, K / 2, 2}).permute({0, 2, 1, 3}).contiguous().view({N / pw, K, pw});
  }
  // (N, K) -> (N/pw, pw, K) -> (N/pw, K, pw)
  return w.contiguous().view({N / pw, pw, K}).transpose(1, 2).contiguous();
}

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  const auto dt = w.scalar_type();
  TORCH_CHECK(w.dim() == 3 && w.size(2) == panel_width(w.size(0) * w.size(2)) &&
                  (dt == at::kFloat || dt == at::kBFloat16) && w.is_contiguous(),
              "linear_packed: the weight must come from pack_linear_weight");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == dt, "linear_packed: x must be a 2-D tensor of the weight's dtype");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0) * w.size(2);
  TORCH_CHECK(w.size(1) == K, "linear_packed: x has ", K, " features, the weight ", w.size(1));
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == dt && bias->is_contiguous(),
                "linear_packed: bias must be a contiguous (", N, ",) tensor of the weight's dtype");
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  if (dt == at::kFloat)
    linear_impl<float>(xc, w, has_bias ? bias->data_ptr<float>() : nullptr, y);
  else
    linear_impl<at::BFloat16>(xc, w, has_bias ? bias->data_ptr<at::BFloat16>() : nullptr, y);
  return y;
}

// Whether bf16 weights of K input features (in 16-column panels) run on AMX tiles in this build and process.
bool gemm_bf16_amx(int64_t K) {
#ifdef CPU_CAPABILITY_AVX512
  return use_bf16_amx(K, 16);
#else
  (void)K;
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("gemm_bf16_amx(int K) -> bool", &gemm_bf16_amx);
  m.def("pack_linear_weight(Tensor w) -> Tensor");
  m.def("linear_packed(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.impl("pack_linear_weight", c10::DispatchKey::CPU, &pack_linear_weight);
  m.impl("linear_packed", c10::DispatchKey::CPU, &linear_packed);
}
