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
// torch rounds), after the bias add in fp32.
//
// The microkernel keeps a tile of R (<= 6) rows x 16 columns in 12 AVX2 registers (8-wide panels: 6;
// narrower ones run the same chains in scalar code) and runs the K
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
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#define RADIXLM_GEMM_AVX2 1
#endif

namespace {

constexpr int64_t kTileRows = 6;  // rows per microkernel tile
constexpr int64_t kRowBlock = 96;  // rows of x per pass over the panels

inline float widen(float v) { return v; }
inline float widen(at::BFloat16 v) { return static_cast<float>(v); }

// Panel width of an (N, K) weight: 16 output columns where N allows, else 8, 4, 2 or 1.
inline int64_t panel_width(int64_t n) {
  for (int64_t pw : {16, 8, 4, 2}) if (n % pw == 0) return pw;
  return 1;
}

template <typename T>
inline void store_row(T* y, const float* acc, const T* bias, int64_t pw) {
  for (int64_t j = 0; j < pw; ++j) {
    const float v = bias != nullptr ? acc[j] + widen(bias[j]) : acc[j];
    y[j] = static_cast<T>(v);
  }
}

// Any panel width, scalar: the same FMA chains as the vector tiles (so results are identical).
template <int R, typename T>
inline void micro_tile_scalar(const T* x, int64_t ldx, const T* panel, int64_t pw, int64_t K, T* y, int64_t ldy,
                              const T* bias) {
  float acc[R][16] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < pw; ++j) acc[r][j] = std::fma(widen(x[r * ldx + k]), widen(panel[k * pw + j]), acc[r][j]);
  for (int r = 0; r < R; ++r) store_row(y + r * ldy, acc[r], bias, pw);
}

#ifdef RADIXLM_GEMM_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {  // 8 bf16 -> 8 fp32 (exact: shift into the high half)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// R rows x V*8 columns in R*V registers (V = 2: 16-wide panels, V = 1: 8-wide).
template <int R, int V, typename T>
inline void micro_tile(const T* x, int64_t ldx, const T* panel, int64_t K, T* y, int64_t ldy, const T* bias) {
  constexpr int64_t PW = 8 * V;
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 b[V];
    for (int v = 0; v < V; ++v) b[v] = load8(panel + k * PW + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_set1_ps(widen(x[r * ldx + k]));
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      for (int v = 0; v < V; ++v) {
        __m256 o = acc[r][v];
        if (bias != nullptr) o = _mm256_add_ps(o, _mm256_loadu_ps(bias + 8 * v));
        _mm256_storeu_ps(y + r * ldy + 8 * v, o);
      }
    } else {
      alignas(32) float tmp[PW];
      for (int v = 0; v < V; ++v) _mm256_store_ps(tmp + 8 * v, acc[r][v]);
      store_row(y + r * ldy, tmp, bias, PW);
    }
  }
}
#endif

template <int R, typename T>
inline void tile_rows(const T* x, int64_t ldx, const T* panel, int64_t pw, int64_t K, T* y, int64_t ldy,
                      const T* bias) {
#ifdef RADIXLM_GEMM_AVX2
  if (pw == 16) return micro_tile<R, 2>(x, ldx, panel, K, y, ldy, bias);
  if (pw == 8) return micro_tile<R, 1>(x, ldx, panel, K, y, ldy, bias);
#endif
  micro_tile_scalar<R>(x, ldx, panel, pw, K, y, ldy, bias);
}

template <typename T>
inline void tile(int64_t rows, const T* x, int64_t ldx, const T* panel, int64_t pw, int64_t K, T* y, int64_t ldy,
                 const T* bias) {
  switch (rows) {
    case 6: tile_rows<6>(x, ldx, panel, pw, K, y, ldy, bias); break;
    case 5: tile_rows<5>(x, ldx, panel, pw, K, y, ldy, bias); break;
    case 4: tile_rows<4>(x, ldx, panel, pw, K, y, ldy, bias); break;
    case 3: tile_rows<3>(x, ldx, panel, pw, K, y, ldy, bias); break;
    case 2: tile_rows<2>(x, ldx, panel, pw, K, y, ldy, bias); break;
    default: tile_rows<1>(x, ldx, panel, pw, K, y, ldy, bias); break;
  }
}

template <typename T>
void linear_impl(const at::Tensor& xc, const at::Tensor& w, const T* bp, at::Tensor& y) {
  const int64_t M = xc.size(0), K = xc.size(1), panels = w.size(0), pw = w.size(2), N = panels * pw;
  const T* xp = xc.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const int64_t ldx = xc.stride(0);
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = std::min(M, m0 + kRowBlock);
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const T* panel = wp + p * K * pw;
        const T* pb = bp != nullptr ? bp + p * pw : nullptr;
        // Tiles of near-equal height (32 rows: 6+6+5+5+5+5, not 6x5+2: a short tile is load-bound).
        const int64_t rows = m1 - m0, tiles = (rows + kTileRows - 1) / kTileRows;
        for (int64_t t = 0, m = m0; t < tiles; ++t) {
          const int64_t h = rows / tiles + (t < rows % tiles ? 1 : 0);
          tile<T>(h, xp + m * ldx, ldx, panel, pw, K, yp + m * N + p * pw, N, pb);
          m += h;
        }
      }
    });
  }
}

at::Tensor pack_linear_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "pack_linear_weight: expected a 2-D float32 or bfloat16 weight");
  const int64_t N = w.size(0), K = w.size(1), pw = panel_width(N);
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("pack_linear_weight(Tensor w) -> Tensor");
  m.def("linear_packed(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.impl("pack_linear_weight", c10::DispatchKey::CPU, &pack_linear_weight);
  m.impl("linear_packed", c10::DispatchKey::CPU, &linear_packed);
}
