// fp32 linear layer over panel-packed weights (CPU): y = x W^T (+ b), the register-blocked
// microkernel scheme of BLIS / GotoBLAS (Goto & van de Geijn 2008; Van Zee & van de Geijn 2015).
//
//   pack_linear_weight(w (N, K) fp32, N % 16 == 0) -> (N / 16, K, 16): panel p holds rows
//       16p .. 16p + 15 of w, k-major, so the microkernel reads 16 output columns of one k as two
//       contiguous 8-float vectors;
//   linear_packed(x (M, K) fp32, w_packed, bias?) -> (M, N).
//
// The microkernel keeps a tile of R (<= 6) rows x 16 columns in 12 AVX2 registers and runs the K
// loop as FMAs of a broadcast x[m, k] with the panel's two vectors for k. Each output element is
// one FMA chain over k = 0 .. K-1 in order, whatever M, the tile a row falls in or the thread that
// computes it: a row's result does not depend on the batch around it (bitwise), which is what
// batch-invariant ("deterministic") inference needs. The bias is added after the chain.
//
// Work split: rows in blocks of up to 96 (a block of x stays in L2 while every panel streams past
// it once), panels across threads (at::parallel_for). Without AVX2 the same chains run as scalar
// std::fma loops (identical results).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#define RADIXLM_GEMM_AVX2 1
#endif

namespace {

constexpr int64_t kPanel = 16;   // output columns per panel
constexpr int64_t kTileRows = 6;  // rows per microkernel tile
constexpr int64_t kRowBlock = 96;  // rows of x per pass over the panels

#ifdef RADIXLM_GEMM_AVX2
template <int R>
inline void micro_tile(const float* x, int64_t ldx, const float* panel, int64_t K, float* y, int64_t ldy,
                       const float* bias) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(panel + k * kPanel);
    const __m256 b1 = _mm256_loadu_ps(panel + k * kPanel + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (bias != nullptr) {
      acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(bias));
      acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(bias + 8));
    }
    _mm256_storeu_ps(y + r * ldy, acc[r][0]);
    _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
  }
}
#else
template <int R>
inline void micro_tile(const float* x, int64_t ldx, const float* panel, int64_t K, float* y, int64_t ldy,
                       const float* bias) {
  float acc[R][kPanel] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < kPanel; ++j) acc[r][j] = std::fma(x[r * ldx + k], panel[k * kPanel + j], acc[r][j]);
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < kPanel; ++j) y[r * ldy + j] = bias != nullptr ? acc[r][j] + bias[j] : acc[r][j];
}
#endif

inline void tile(int64_t rows, const float* x, int64_t ldx, const float* panel, int64_t K, float* y, int64_t ldy,
                 const float* bias) {
  switch (rows) {
    case 6: micro_tile<6>(x, ldx, panel, K, y, ldy, bias); break;
    case 5: micro_tile<5>(x, ldx, panel, K, y, ldy, bias); break;
    case 4: micro_tile<4>(x, ldx, panel, K, y, ldy, bias); break;
    case 3: micro_tile<3>(x, ldx, panel, K, y, ldy, bias); break;
    case 2: micro_tile<2>(x, ldx, panel, K, y, ldy, bias); break;
    default: micro_tile<1>(x, ldx, panel, K, y, ldy, bias); break;
  }
}

at::Tensor pack_linear_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "pack_linear_weight: expected a 2-D float32 weight");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % kPanel == 0, "pack_linear_weight: out_features ", N, " is not a multiple of ", kPanel);
  // (N, K) -> (N/16, 16, K) -> (N/16, K, 16)
  return w.contiguous().view({N / kPanel, kPanel, K}).transpose(1, 2).contiguous();
}

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "linear_packed: x must be a 2-D float32 tensor");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == kPanel && w.scalar_type() == at::kFloat && w.is_contiguous(),
              "linear_packed: the weight must come from pack_linear_weight");
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0), N = panels * kPanel;
  TORCH_CHECK(w.size(1) == K, "linear_packed: x has ", K, " features, the weight ", w.size(1));
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == at::kFloat && bias->is_contiguous(),
                "linear_packed: bias must be a contiguous float32 (", N, ",) tensor");
    bp = bias->data_ptr<float>();
  }
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = xc.stride(0);
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = std::min(M, m0 + kRowBlock);
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const float* panel = wp + p * K * kPanel;
        const float* pb = bp != nullptr ? bp + p * kPanel : nullptr;
        // Tiles of near-equal height (32 rows: 6+6+5+5+5+5, not 6x5+2: a short tile is load-bound).
        const int64_t rows = m1 - m0, tiles = (rows + kTileRows - 1) / kTileRows;
        for (int64_t t = 0, m = m0; t < tiles; ++t) {
          const int64_t h = rows / tiles + (t < rows % tiles ? 1 : 0);
          tile(h, xp + m * ldx, ldx, panel, K, yp + m * N + p * kPanel, N, pb);
          m += h;
        }
      }
    });
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("pack_linear_weight(Tensor w) -> Tensor");
  m.def("linear_packed(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.impl("pack_linear_weight", c10::DispatchKey::CPU, &pack_linear_weight);
  m.impl("linear_packed", c10::DispatchKey::CPU, &linear_packed);
}
