// The gate-up linear of a SwiGLU MLP with its SiLU-and-mul fused (Shazeer 2020), on the AVX512-BF16
// pair panels (bf16_packed_avx512.h):
//
//   gemm_swiglu_fused(K, I) -> bool: whether this process fuses a bf16 gate-up of K inputs and I
//       intermediate features (AVX512-BF16 without AMX, K even, I a multiple of 48);
//   pack_gate_up_weight(w (2I, K) bf16: gate rows then up rows) -> pack_linear_weight of the rows
//       interleaved in blocks of 48 (gate 0-47, up 0-47, gate 48-95, ...);
//   linear_packed_silu_mul(x (M, K), w from pack_gate_up_weight) -> (M, I) = silu(x Wg^T) * (x Wu^T).
//
// A work unit is one 48-column block of gate and the same block of up (one 8 x 48 register tile's
// columns each): the thread multiplies its rows by both into two (rows x 48) bf16 scratches in L2 and
// writes silu(gate) * up from them, so the (M, 2I) gate-up output never goes to memory and back.
// Every number is the unfused path's: the same tiles, chains and bf16 rounding of gate and up (a
// column's chain does not depend on the columns beside it), then silu_mul_avx512.h as silu_and_mul
// runs it. Under 8 rows (bf16_packed_avx512.h streams the weight panel by panel there) it runs the
// linear and then the same SiLU-and-mul over the interleaved blocks.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "bf16_dot.h"
#ifdef CPU_CAPABILITY_AVX512
#include "bf16_amx.h"
#include "bf16_packed_avx512.h"
#include "../../elementwise/cpu/silu_mul_avx512.h"
#endif

#include <vector>

namespace {

constexpr int64_t kBlock = 48;  // columns of a unit: one register tile's 3 pair panels

bool fused(int64_t K, int64_t I) {
#ifdef CPU_CAPABILITY_AVX512
  return radixlm_gemm::use_bf16_pairs(K, 16) && !radixlm_gemm::use_bf16_amx(K, 16) && I > 0 && I % kBlock == 0;
#else
  (void)K, (void)I;
  return false;
#endif
}

bool gemm_swiglu_fused(int64_t K, int64_t I) { return fused(K, I); }

at::Tensor pack_gate_up_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.size(0) % 2 == 0,
              "pack_gate_up_weight: expected a (2 * I, K) bfloat16 weight");
  const int64_t I = w.size(0) / 2, K = w.size(1);
  TORCH_CHECK(fused(K, I), "pack_gate_up_weight: no fused gate-up for K = ", K, ", I = ", I,
              " on this CPU (check gemm_swiglu_fused first)");
  // (2, I / 48, 48, K) -> (I / 48, 2, 48, K): gate block j then up block j
  const at::Tensor inter = w.contiguous().view({2, I / kBlock, kBlock, K}).transpose(0, 1).contiguous().view({2 * I, K});
  static auto pack = c10::Dispatcher::singleton().findSchemaOrThrow("radixlm_cpu::pack_linear_weight", "")
                         .typed<at::Tensor(const at::Tensor&)>();
  return pack.call(inter);
}

#ifdef CPU_CAPABILITY_AVX512
// out[r, 48 j + c] = silu(y[r, 96 j + c]) * y[r, 96 j + 48 + c] over the interleaved blocks.
void silu_mul_interleaved(const at::BFloat16* y, int64_t M, int64_t I, at::BFloat16* out) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < I / kBlock; ++j)
      for (int64_t c = 0; c < kBlock; c += 16)
        radixlm_math::silu_mul_bf16x16(y + r * 2 * I + 2 * j * kBlock + c, y + r * 2 * I + (2 * j + 1) * kBlock + c,
                                       out + r * I + j * kBlock + c);
}

void fused_rows(const at::BFloat16* x, int64_t ldx, int64_t M, const at::BFloat16* w, int64_t K, int64_t I,
                at::BFloat16* out) {
  using namespace radixlm_gemm;
  const int64_t ps = K * 16, unit_stride = 2 * kPairPanels * ps;  // a unit: 3 gate panels, then 3 up panels
  const int64_t units = I / kBlock, row_block = pair_row_block(K);
  const bool k_blocks = K / 2 > kPairKBlock;
  const radixlm_parallel::Shares s(units);
  for (int64_t m0 = 0; m0 < M; m0 += row_block) {
    const int64_t m1 = std::min(M, m0 + row_block), rows = m1 - m0;
    radixlm_parallel::parallel_steal(s.threads, [&](int64_t t) { return s.count(t); }, [&](int64_t, int64_t, auto&& run) {
      std::unique_ptr<float[]> part(k_blocks ? new float[rows * kBlock] : nullptr);
      std::vector<at::BFloat16> gate(rows * kBlock), up(rows * kBlock);
      run([&](int64_t t, int64_t u) {
        const int64_t unit = s.begin(t) + u;
        const at::BFloat16* wg = w + unit * unit_stride;
        const at::BFloat16* wu = wg + kPairPanels * ps;
        const bool more = unit + 1 < s.end(t);  // the owner's next unit (a thief's prefetch is only wasted)
        pair_group(x, ldx, m0, m1, K, wg, ps, kPairPanels, part.get(), gate.data(), kBlock, nullptr, wu, kPairPanels);
        pair_group(x, ldx, m0, m1, K, wu, ps, kPairPanels, part.get(), up.data(), kBlock, nullptr,
                   more ? wg + unit_stride : nullptr, more ? kPairPanels : 0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < kBlock; c += 16)
            radixlm_math::silu_mul_bf16x16(gate.data() + r * kBlock + c, up.data() + r * kBlock + c,
                                           out + (m0 + r) * I + unit * kBlock + c);
      });
    });
  }
}
#endif

at::Tensor linear_packed_silu_mul(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kBFloat16 && w.size(2) == 16 && w.is_contiguous(),
              "linear_packed_silu_mul: the weight must come from pack_gate_up_weight");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "linear_packed_silu_mul: x must be a 2-D bfloat16 tensor");
  const int64_t M = x.size(0), K = x.size(1), I = w.size(0) * 16 / 2;
  TORCH_CHECK(w.size(1) == K, "linear_packed_silu_mul: x has ", K, " features, the weight ", w.size(1));
  TORCH_CHECK(fused(K, I), "linear_packed_silu_mul: no fused gate-up for K = ", K, ", I = ", I, " on this CPU");
  at::Tensor out = at::empty({M, I}, x.options());
#ifdef CPU_CAPABILITY_AVX512
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  if (M >= radixlm_gemm::kPairStreamRows) {
    fused_rows(xc.data_ptr<at::BFloat16>(), xc.stride(0), M, w.data_ptr<at::BFloat16>(), K, I, out.data_ptr<at::BFloat16>());
    return out;
  }
  static auto linear = c10::Dispatcher::singleton().findSchemaOrThrow("radixlm_cpu::linear_packed", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&)>();
  const at::Tensor y = linear.call(xc, w, c10::nullopt);
  silu_mul_interleaved(y.data_ptr<at::BFloat16>(), M, I, out.data_ptr<at::BFloat16>());
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("gemm_swiglu_fused(int K, int I) -> bool", &gemm_swiglu_fused);
  m.def("pack_gate_up_weight(Tensor w) -> Tensor");
  m.def("linear_packed_silu_mul(Tensor x, Tensor w) -> Tensor");
  m.impl("pack_gate_up_weight", c10::DispatchKey::CPU, &pack_gate_up_weight);
  m.impl("linear_packed_silu_mul", c10::DispatchKey::CPU, &linear_packed_silu_mul);
}
