// A stack of Llama decoder layers as one op (CPU): the per-layer kernels of a forward — fused
// add + RMSNorm, the QKV / O / gate-up / down linears, RoPE, paged attention (which stores the new
// K/V), SiLU-and-mul — called from C++ through the dispatcher instead of ~9 Python calls per layer.
//
// At batch 1 a 30-layer step makes ~270 such calls; each costs 3-5 us of Python (argument parsing,
// module wrappers, views) against ~1 us of work for the small ones, so at one user's decode the
// Python around the kernels was ~2.4 of ~8 ms a step (docs/benchmarks.md). The op runs the very
// same kernels on the very same arguments in the same order as the layer modules do
// (srt/models/llama.py), so its output is bitwise theirs (tests/engine/test_decoder_stack.py).
//
//   decoder_layers(h, cos, sin, norm_weights, eps, weights, kinds, in_features, num_heads, num_kv_heads, head_dim, k_caches, v_caches, <paged_attention's batch
//                  arguments>, scaling) -> delta
//
// h (T, hidden): the residual stream, updated in place (each layer's residual adds, as the
// modules' fused add + norm do); returns the last layer's MLP output (T, hidden), which the caller
// adds with the final norm. cos, sin (T, head_dim) in h's dtype. norm_weights: 2 per layer (input,
// post-attention). weights: 4 per layer (qkv, o, gate_up, down) with kinds: >= 0 a quantized format
// code (radixlm_cpu::quant_linear, fp32 or bf16 activations as they are), -1 a packed weight (radixlm_cpu::linear_packed), -2 a dense one
// (aten::linear), -3 (gate_up only) a weight from pack_gate_up_weight, whose linear_packed_silu_mul
// replaces the linear and the SiLU-and-mul; no biases. k_caches, v_caches: one per layer, the pool's (KVH, slots, D) buffers.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace {

using at::Tensor;
using OptTensor = c10::optional<Tensor>;

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

struct Ops {
  c10::TypedOperatorHandle<Tensor(Tensor, const OptTensor&, const Tensor&, double)> norm =
      op<Tensor(Tensor, const OptTensor&, const Tensor&, double)>("radixlm_cpu::add_rms_norm_");
  c10::TypedOperatorHandle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&)> rope =
      op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>("radixlm_cpu::rope");
  c10::TypedOperatorHandle<Tensor(const Tensor&)> silu = op<Tensor(const Tensor&)>("radixlm_cpu::silu_and_mul");
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&)> swiglu =
      op<Tensor(const Tensor&, const Tensor&)>("radixlm_cpu::linear_packed_silu_mul");
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, int64_t, int64_t, bool)> quant =
      op<Tensor(const Tensor&, const Tensor&, int64_t, int64_t, bool)>("radixlm_cpu::quant_linear");
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, const OptTensor&)> packed =
      op<Tensor(const Tensor&, const Tensor&, const OptTensor&)>("radixlm_cpu::linear_packed");
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, const Tensor&, Tensor, Tensor, const Tensor&,
                                  const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, double)>
      attention = op<Tensor(const Tensor&, const Tensor&, const Tensor&, Tensor, Tensor, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            double)>("radixlm_cpu::paged_attention");
};

const Ops& ops() {
  static const Ops o;  // looked up on the first call, when the library's ops are all registered
  return o;
}

constexpr int64_t kFusedSwiglu = -3;  // a gate-up weight from pack_gate_up_weight (gemm/cpu/swiglu.cpp)

// y = x W^T as the layer's GemmBackend computes it for these rows (kernels/gemm, kernels/quant).
Tensor linear(const Ops& o, const Tensor& x, const Tensor& w, int64_t kind, int64_t in_features) {
  if (kind >= 0) {
    Tensor y = o.quant.call(x, w, kind, in_features, false);
    return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
  }
  if (kind == -1) return o.packed.call(x, w, c10::nullopt);
  return at::linear(x, w);
}

Tensor decoder_layers(Tensor h, const Tensor& cos, const Tensor& sin, at::TensorList norm_weights, double eps,
                      at::TensorList weights, at::IntArrayRef kinds, at::IntArrayRef in_features,
                      int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, at::TensorList k_caches,
                      at::TensorList v_caches, const Tensor& out_cache_loc, const Tensor& req_to_token,
                      const Tensor& req_pool_indices, const Tensor& prefix_lens, const Tensor& extend_lens,
                      const Tensor& cascade_reqs, const Tensor& cascade_offsets, const Tensor& cascade_lens,
                      double scaling) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(h.dim() == 2 && h.is_contiguous(), "decoder_layers: h must be a contiguous (tokens, hidden) tensor");
  TORCH_CHECK(layers > 0 && v_caches.size() == k_caches.size() && norm_weights.size() == 2 * k_caches.size() &&
                  weights.size() == 4 * k_caches.size() && kinds.size() == weights.size() &&
                  in_features.size() == weights.size(),
              "decoder_layers: per layer 2 norm weights, 4 linear weights with their kinds and in_features, "
              "one K and one V cache");
  const Ops& o = ops();
  const int64_t t = h.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  Tensor delta;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t* kind = kinds.data() + 4 * l;
    const int64_t* kin = in_features.data() + 4 * l;
    const Tensor* w = weights.data() + 4 * l;
    // attention block: x = norm(h += delta); q, k, v = x Wqkv^T; rope; attend (stores K/V); o_proj
    Tensor x = o.norm.call(h, delta.defined() ? OptTensor(delta) : OptTensor(), norm_weights[2 * l], eps);
    Tensor qkv = linear(o, x, w[0], kind[0], kin[0]);
    TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "decoder_layers: layer ", l, "'s qkv has ", qkv.size(1),
                " features, the heads ", q_size + 2 * kv_size);
    Tensor q = qkv.narrow(1, 0, q_size).view({t, num_heads, head_dim});
    Tensor k = qkv.narrow(1, q_size, kv_size).view({t, num_kv_heads, head_dim});
    Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, num_kv_heads, head_dim});  // stored as a view
    auto [qr, kr] = o.rope.call(q, k, cos, sin);
    Tensor attn = o.attention.call(qr, kr, v, k_caches[l], v_caches[l], out_cache_loc, req_to_token,
                                   req_pool_indices, prefix_lens, extend_lens, cascade_reqs, cascade_offsets,
                                   cascade_lens, scaling);
    Tensor a = linear(o, attn.view({t, q_size}), w[1], kind[1], kin[1]);
    // MLP block: x = norm(h += a); delta = down(silu(gate) * up)
    x = o.norm.call(h, OptTensor(a), norm_weights[2 * l + 1], eps);
    Tensor act = kind[2] == kFusedSwiglu ? o.swiglu.call(x, w[2]) : o.silu.call(linear(o, x, w[2], kind[2], kin[2]));
    delta = linear(o, act, w[3], kind[3], kin[3]);
  }
  return delta;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("decoder_layers(Tensor(a!) h, Tensor cos, Tensor sin, Tensor[] norm_weights, float eps, Tensor[] weights, "
        "int[] kinds, int[] in_features, int num_heads, int num_kv_heads, int head_dim, "
        "Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, Tensor out_cache_loc, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor prefix_lens, Tensor extend_lens, Tensor cascade_reqs, "
        "Tensor cascade_offsets, Tensor cascade_lens, float scaling) -> Tensor");
  m.impl("decoder_layers", c10::DispatchKey::CPU, &decoder_layers);
}
