// KDA decode, streaming layout: a persistent kernel for large batches (KdaLayout::kStream).
//
// The many-heads kernel holds one head's 64 KB state in registers, two CTAs per SM: each CTA loads, computes,
// then stores, and the phases of the two resident CTAs overlap only in part (81 % of copy bandwidth at N >= 64
// on the H200, docs/perf.md). Here one CTA per SM walks the (sequence, head) items n * H + h = blockIdx.x,
// + gridDim.x, ... and keeps the HBM busy without gaps:
//   - each item's fp32 state lands in shared memory with one 64 KB bulk copy (TMA) issued two items ahead, on
//     a ring of three buffers with one mbarrier each;
//   - its small inputs (q/k/v rows, the three conv-state rows, conv weights, f, gz, dt_bias: ~7 KB) stream in
//     with cp.async one item ahead;
//   - the update reads the state from shared memory twice (the column sums S^T k and S^T q of the decayed
//     state, then the rank-1 update) and stores the new state straight from registers to global memory, a
//     512-byte row per warp instruction, so the buffer is free again when the item ends.
// A warp covers one whole 128-column row per shared-memory access (lane = 4 columns): no bank conflicts, and
// the column sums combine the 8 warps' partials through shared memory. Same numerics as kda_decode_kernel.cuh.
#include "kernels/common/pdl.cuh"
#include "kernels/common/smem_opt_in.h"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_cuda_check.h"
#include "kernels/kda/kda_decode_kernel.cuh"
#include "kernels/kda/kda_device.cuh"

namespace ds::kda {
namespace dev {
namespace {

constexpr int kStreamThreads = 256;
constexpr int kStreamWarps = kStreamThreads / 32;
constexpr int kStateStages = 3;  // 192 KB: items k+1 and k+2 in flight while item k computes
constexpr uint32_t kStateBytes = kD * kD * sizeof(float);

// One item's small inputs, copied one item ahead (two buffers).
struct StreamInputs {
  bf16 x[3][kD];                // q | k | v pre-conv inputs of head h
  bf16 conv[kConvRows][3][kD];  // conv-state rows (oldest first) of the q | k | v channels of head h
  bf16 w[3][kD][kConvWidth];    // conv weights of those channels
  bf16 f[kD];
  bf16 gz[kD];
  float dt[kD];
};
struct StreamSmem {
  float state[kStateStages][kD][kD];
  StreamInputs in[2];
  float q[kD], k[kD], alpha[kD], v[kD];  // conv + SiLU outputs and the gate of the current item
  float part[kStreamWarps][2][kD];       // per-warp column partials of S^T k and S^T q
  uint64_t full[kStateStages];           // state buffer s has landed (phase parity = fill count & 1)
  int slot[kStateStages];                // slot of the item in buffer s (< 0: padding, nothing copied)
};
static_assert(sizeof(StreamSmem) <= 227 * 1024, "one CTA per SM: at most 227 KB of shared memory (sm_90)");

struct Item {
  int n, h;
};
__device__ __forceinline__ Item item_at(int64_t i, int H) { return {static_cast<int>(i / H), static_cast<int>(i % H)}; }

__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}

// Thread 0: the state copy of an item (slot known) into buffer b, or a bare arrival for a padding row.
__device__ void issue_state(const KdaDecodeParams& p, StreamSmem& sm, int b, int slot, int h) {
  sm.slot[b] = slot;
  if (slot < 0) {
    mbar_arrive(&sm.full[b]);
    return;
  }
  mbar_arrive_expect_tx(&sm.full[b], kStateBytes);
  bulk_copy_g2s(sm.state[b], p.state_pool + (static_cast<size_t>(slot) * p.H + h) * kD * kD, kStateBytes,
                &sm.full[b]);
}

// Every thread: its share of item (n, h)'s small inputs into `in` (one cp.async group; padding rows copy too,
// their values are never used). 8-byte copies for the activations (the op's alignment contract), 16-byte ones
// for the weights.
__device__ void issue_inputs(const KdaDecodeParams& p, StreamInputs& in, int n, int h, int slot, int tid) {
  const int P = p.H * kD;
  const int64_t row3 = 3 * static_cast<int64_t>(P);
  const bf16* cpool =
      reinterpret_cast<const bf16*>(p.conv_pool) + static_cast<size_t>(slot < 0 ? 0 : slot) * kConvRows * row3;
  constexpr int kRow8 = kD / 4;  // 8-byte pieces per 128-channel row
  // pieces: x 3 rows, conv 9 rows, f, gz (8 B each: 14 * 32); weights 3 * 128 * 4 bf16 and dt (16 B: 96 + 32)
  constexpr int kAct = 14 * kRow8, kW = 3 * kD * kConvWidth * 2 / 16, kDt = kD * 4 / 16;
  for (int e = tid; e < kAct + kW + kDt; e += kStreamThreads) {
    if (e < kAct) {
      const int row = e / kRow8, c = (e % kRow8) * 4;
      if (row < 3) {
        const Bf16Rows& r = row == 0 ? p.q : row == 1 ? p.k : p.v;
        cp_async8(&in.x[row][c],
                  reinterpret_cast<const bf16*>(r.ptr) + static_cast<int64_t>(n) * r.stride + h * kD + c);
      } else if (row < 12) {
        const int cr = (row - 3) / 3, which = (row - 3) % 3;
        cp_async8(&in.conv[cr][which][c], cpool + cr * row3 + which * P + h * kD + c);
      } else {
        const Bf16Rows& r = row == 12 ? p.f : p.gz;
        cp_async8(row == 12 ? &in.f[c] : &in.gz[c],
                  reinterpret_cast<const bf16*>(r.ptr) + static_cast<int64_t>(n) * r.stride + h * kD + c);
      }
    } else if (e < kAct + kW) {
      const int j = e - kAct, which = j / (kW / 3), o = (j % (kW / 3)) * 8;  // 8 bf16 = 2 channels x 4 taps
      cp_async16(&in.w[which][0][0] + o,
                 reinterpret_cast<const bf16*>(p.conv_w) + (static_cast<size_t>(which) * P + h * kD) * kConvWidth + o);
    } else {
      const int j = e - kAct - kW;
      cp_async16(&in.dt[j * 4], p.dt_bias + h * kD + j * 4);
    }
  }
}

__global__ void __launch_bounds__(kStreamThreads, 1)
    kda_decode_stream_kernel(const __grid_constant__ KdaDecodeParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  StreamSmem& sm = *reinterpret_cast<StreamSmem*>(smem_raw);
  const int H = p.H, P = H * kD;
  const int64_t items = static_cast<int64_t>(p.N) * H;
  const int64_t first = blockIdx.x, step = gridDim.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t row3 = 3 * static_cast<int64_t>(P);
  // The k-th item of this CTA is first + k * step; count them.
  const int count = static_cast<int>((items - first + step - 1) / step);

  pdl::launch_dependents();
  if (tid == 0) {
    for (int s = 0; s < kStateStages; ++s) mbar_init(&sm.full[s], 1);
    mbar_fence_init();
  }
  __syncthreads();
  // Slot ids and the state were written two or more kernels back when qkv_ready (pdl.cuh); otherwise wait first.
  if (!p.qkv_ready) pdl::wait();
  // Thread 0 keeps the slot of the next item whose state it will issue one step ahead in a register.
  int next_slot = 0;
  if (tid == 0) {
    for (int k = 0; k < kStateStages - 1 && k < count; ++k) {
      const Item it = item_at(first + k * step, H);
      issue_state(p, sm, k, p.slot_ids[it.n], it.h);
    }
    if (kStateStages - 1 < count) next_slot = p.slot_ids[item_at(first + (kStateStages - 1) * step, H).n];
  }
  pdl::wait();  // f and gz come from the previous kernel
  // Per item, read one item ahead into registers: the gate's -exp(A_log) and beta.
  const auto scalars = [&](const Item& it, float& negA, float& beta) {
    negA = -expf(__ldg(p.A_log + it.h));
    const bf16* b = reinterpret_cast<const bf16*>(p.beta_logits.ptr);
    beta = sigmoidf_(__bfloat162float(pdl::load_prior(b + static_cast<int64_t>(it.n) * p.beta_logits.stride + it.h)));
  };
  float negA = 0.f, beta = 0.f;
  {
    const Item it = item_at(first, H);
    issue_inputs(p, sm.in[0], it.n, it.h, p.slot_ids[it.n], tid);
    scalars(it, negA, beta);
  }
  cp_async_commit();
  __syncthreads();  // the slots of the first items (sm.slot) are visible

  for (int k = 0; k < count; ++k) {
    const Item it = item_at(first + k * step, H);
    const int n = it.n, h = it.h, b = k % kStateStages;
    StreamInputs& in = sm.in[k & 1];
    // Refill: buffer (k + 2) % 3 held item k - 1, finished at the barrier that ended it.
    if (tid == 0 && k + kStateStages - 1 < count) {
      const int kk = k + kStateStages - 1;
      issue_state(p, sm, kk % kStateStages, next_slot, item_at(first + kk * step, H).h);
      if (kk + 1 < count) next_slot = p.slot_ids[item_at(first + (kk + 1) * step, H).n];
    }
    float negA_next = 0.f, beta_next = 0.f;
    if (k + 1 < count) {  // its slot was set when its state copy was issued, before the last barrier
      const Item nx = item_at(first + (k + 1) * step, H);
      issue_inputs(p, sm.in[(k + 1) & 1], nx.n, nx.h, sm.slot[(k + 1) % kStateStages], tid);
      scalars(nx, negA_next, beta_next);
    }
    cp_async_commit();
    cp_async_wait_group<1>();  // this item's inputs (the group committed one step back) have landed
    __syncthreads();
    const int slot = sm.slot[b];
    bf16* out_row = reinterpret_cast<bf16*>(p.out) + static_cast<int64_t>(n) * p.out_stride + h * kD;
    if (slot < 0) {  // padding row: zero output, no state; the buffer's phase completed with a bare arrival
      mbar_wait(&sm.full[b], (k / kStateStages) & 1);
      if (tid < kD / 4) store_bf16x4(out_row + 4 * tid, make_float4(0.f, 0.f, 0.f, 0.f));
      negA = negA_next, beta = beta_next;
      __syncthreads();
      continue;
    }

    // Conv + SiLU of the q, k, v channels (4-channel jobs 0-95), the gate (96-127); the new conv-state rows
    // (the window shifted by one) go straight to global memory.
    if (tid < 96) {
      const int which = tid >> 5, c = (tid & 31) * 4;
      const float4 x = load_bf16x4(&in.x[which][c]);
      const float4 s0 = load_bf16x4(&in.conv[0][which][c]), s1 = load_bf16x4(&in.conv[1][which][c]);
      const float4 s2 = load_bf16x4(&in.conv[2][which][c]);
      const float4 y = conv4_silu(&in.w[0][0][0], which * kD + c, s0, s1, s2, x);
      *reinterpret_cast<float4*>((which == 0 ? sm.q : which == 1 ? sm.k : sm.v) + c) = y;
      bf16* cp = reinterpret_cast<bf16*>(p.conv_pool) + static_cast<size_t>(slot) * kConvRows * row3 + which * P +
                 h * kD + c;
      *reinterpret_cast<uint2*>(cp) = *reinterpret_cast<const uint2*>(&in.conv[1][which][c]);
      *reinterpret_cast<uint2*>(cp + row3) = *reinterpret_cast<const uint2*>(&in.conv[2][which][c]);
      *reinterpret_cast<uint2*>(cp + 2 * row3) = *reinterpret_cast<const uint2*>(&in.x[which][c]);
    } else if (tid < 128) {
      const int c = (tid - 96) * 4;
      const float4 f = load_bf16x4(&in.f[c]);
      const float4 dt = *reinterpret_cast<const float4*>(&in.dt[c]);
      *reinterpret_cast<float4*>(&sm.alpha[c]) =
          make_float4(exp_fast(negA * softplusf_(f.x + dt.x)), exp_fast(negA * softplusf_(f.y + dt.y)),
                      exp_fast(negA * softplusf_(f.z + dt.z)), exp_fast(negA * softplusf_(f.w + dt.w)));
    }
    mbar_wait(&sm.full[b], (k / kStateStages) & 1);
    __syncthreads();

    const auto [rq, rk, qk] = qk_norms(sm.q, sm.k, lane);  // every warp
    const int c0 = 4 * lane;                                // this lane's 4 state columns

    // Pass 1: column partials of k^T Sd and q^T Sd over this warp's rows (warp + 8 i) of the decayed state.
    const float(*S)[kD] = sm.state[b];
    float kS[4] = {0.f, 0.f, 0.f, 0.f}, qS[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kD / kStreamWarps; ++i) {
      const int r = warp + kStreamWarps * i;
      const float4 s = *reinterpret_cast<const float4*>(&S[r][c0]);
      const float a = sm.alpha[r], kr = sm.k[r] * rk * a, qr = sm.q[r] * rq * a;
      kS[0] += kr * s.x, kS[1] += kr * s.y, kS[2] += kr * s.z, kS[3] += kr * s.w;
      qS[0] += qr * s.x, qS[1] += qr * s.y, qS[2] += qr * s.z, qS[3] += qr * s.w;
    }
    *reinterpret_cast<float4*>(&sm.part[warp][0][c0]) = make_float4(kS[0], kS[1], kS[2], kS[3]);
    *reinterpret_cast<float4*>(&sm.part[warp][1][c0]) = make_float4(qS[0], qS[1], qS[2], qS[3]);
    __syncthreads();
    float4 ks = make_float4(0.f, 0.f, 0.f, 0.f), qs = ks;
#pragma unroll
    for (int w = 0; w < kStreamWarps; ++w) {
      const float4 a = *reinterpret_cast<const float4*>(&sm.part[w][0][c0]);
      const float4 c = *reinterpret_cast<const float4*>(&sm.part[w][1][c0]);
      ks.x += a.x, ks.y += a.y, ks.z += a.z, ks.w += a.w;
      qs.x += c.x, qs.y += c.y, qs.z += c.z, qs.w += c.w;
    }
    const float4 v4 = *reinterpret_cast<const float4*>(&sm.v[c0]);
    const float u[4] = {beta * (v4.x - ks.x), beta * (v4.y - ks.y), beta * (v4.z - ks.z), beta * (v4.w - ks.w)};

    // Pass 2: S = diag(alpha) S + k^ u^T, stored to the pool a row per warp instruction.
    float* Sg = p.state_pool + (static_cast<size_t>(slot) * H + h) * kD * kD;
#pragma unroll
    for (int i = 0; i < kD / kStreamWarps; ++i) {
      const int r = warp + kStreamWarps * i;
      const float4 s = *reinterpret_cast<const float4*>(&S[r][c0]);
      const float a = sm.alpha[r], kr = sm.k[r] * rk;
      __stcs(reinterpret_cast<float4*>(Sg + r * kD + c0),
             make_float4(a * s.x + kr * u[0], a * s.y + kr * u[1], a * s.z + kr * u[2], a * s.w + kr * u[3]));
    }

    // o = Sd^T q^ + (q^.k^) u, then the gated RMSNorm over the 128 columns: warp 0 (every warp holds o).
    if (warp == 0) {
      const float o[4] = {round_bf16(qs.x + qk * u[0]), round_bf16(qs.y + qk * u[1]),  // bf16, as the model's o
                          round_bf16(qs.z + qk * u[2]), round_bf16(qs.w + qk * u[3])};
      const float ss = xor_sum<0, 4>(o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3]);
      const float rs = rsqrtf(ss / kD + p.norm_eps);
      const float4 gz = load_bf16x4(&in.gz[c0]);
      const float4 onw = __ldg(reinterpret_cast<const float4*>(p.o_norm_w + c0));
      store_bf16x4(out_row + c0, make_float4(o[0] * rs * onw.x * sigmoidf_(gz.x), o[1] * rs * onw.y * sigmoidf_(gz.y),
                                             o[2] * rs * onw.z * sigmoidf_(gz.z), o[3] * rs * onw.w * sigmoidf_(gz.w)));
    }
    negA = negA_next, beta = beta_next;
    __syncthreads();  // buffer b, the inputs and the per-item scratch are free
  }
  cp_async_wait_group<0>();
}

}  // namespace
}  // namespace dev

namespace {
int stream_setup_sms() {
  static PerDeviceOnce smem_once;
  KDA_CUDA_CHECK(opt_in_dynamic_smem(smem_once, dev::kda_decode_stream_kernel, sizeof(dev::StreamSmem)));
  return detail::current_device_sm_count();
}
}  // namespace

void kda_decode_stream_launch(const KdaDecodeParams& p, cudaStream_t stream) {
  if (p.N == 0) return;
  const int64_t items = static_cast<int64_t>(p.N) * p.H;
  const int sms = stream_setup_sms();
  const unsigned grid = static_cast<unsigned>(items < sms ? items : sms);
  KDA_CUDA_CHECK(pdl::launch(true, dev::kda_decode_stream_kernel, dim3(grid), dim3(dev::kStreamThreads),
                             sizeof(dev::StreamSmem), stream, p));
  KDA_CHECK_LAUNCH();
}

}  // namespace ds::kda
