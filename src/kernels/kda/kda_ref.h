// KDA (Kimi Delta Attention) CPU references in fp32: the definitions the CUDA kernels are tested against.
//
// Layouts (T = total tokens of a varlen batch, N sequences, H heads, K = V = head dim, C channels):
//   q, k      [T, H, K]     raw (the recurrence L2-normalises them when qk_l2norm is set)
//   v         [T, H, V]
//   g         [T, H, K]     log-decay per channel (<= 0): g = -exp(A_log[h]) * softplus(f + dt_bias)
//   beta      [T, H]        already sigmoid-ed
//   state     [N, H, K, V]  fp32, row = key dim (the HF/fla/vLLM layout), read as initial and written as final
//   cu_seqlens [N + 1]      token offsets; sequences may be empty
//   conv_state [N, W-1, C]  the last W-1 pre-activation inputs of each channel, oldest first (channel
//                           contiguous, so a decode step reads/writes W-1 coalesced rows)
#pragma once

#include <cstdint>

namespace ds::kda {

struct RecurrenceArgs {
  const float* q;            // [T, H, K]
  const float* k;            // [T, H, K]
  const float* v;            // [T, H, V]
  const float* g;            // [T, H, K]
  const float* beta;         // [T, H]
  const int32_t* cu_seqlens; // [N + 1]
  int N, H, K, V;
  float scale;               // applied to q after the L2 norm (K^-0.5)
  bool qk_l2norm = true;     // x / sqrt(sum x^2 + 1e-6)
};

inline constexpr float kL2NormEps = 1e-6f;

// g = -exp(A_log[h]) * softplus(f + dt_bias), softplus with PyTorch's threshold 20.
//   f [T, H*K], A_log [H], dt_bias [H*K] -> g [T, H*K]
void gate_ref(const float* f, const float* A_log, const float* dt_bias, int T, int H, int K, float* g);

// Token-by-token delta rule (spec 3.2): decay, delta correction, rank-1 write, read with the updated state.
// state [N, H, K, V] in/out; o [T, H, V].
void recurrent_ref(const RecurrenceArgs& a, float* state, float* o);

// Chunkwise-parallel form (spec 4.1: UT transform / WY factors, chunk of `chunk` tokens). Same contract and,
// up to fp32 rounding, the same results as recurrent_ref.
void chunked_ref(const RecurrenceArgs& a, float* state, float* o, int chunk = 64);

// Short causal depthwise conv, W taps, then SiLU: y_t[c] = silu(sum_i w[c, i] * x_{t-W+1+i}[c]), inputs before
// the sequence start come from conv_state, which is updated to the last W-1 inputs.
//   x [T, C], w [C, W], conv_state [N, W-1, C] in/out, y [T, C]
void short_conv_ref(const float* x, const float* w, const int32_t* cu_seqlens, int N, int C, int W,
                    float* conv_state, float* y);

// Gated RMSNorm of the KDA output (o_norm with sigmoid output gate), per head, on o rounded to bf16 first (the
// model's o is bf16: HF's chunk_kda / fused_recurrent return q's dtype before o_norm; the CUDA kernels do the same):
//   out = o * rsqrt(mean_V(o^2) + eps) * w * sigmoid(gz)      o, gz, out [T, H, V]; w [V]
// round_o = false: o as given (fp32), for tests of the maths alone.
void gated_rmsnorm_ref(const float* o, const float* gz, const float* w, int T, int H, int V, float eps, float* out,
                       bool round_o = true);

}  // namespace ds::kda
