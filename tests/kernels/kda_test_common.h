// KDA kernel tests: random layer problems (packed, strided bf16 inputs; state pools with sentinel slots) and
// the fp32 CPU reference of a whole KDA layer built from kda_ref.h (conv -> bf16 -> gate, norms, recurrence,
// gated RMSNorm), shared by the decode and prefill tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"
#endif
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_ref.h"
#include "tests/test_util.h"

namespace ds::kda::test {

constexpr int kD = kHeadDim;
constexpr float kStateSentinel = 1e30f;  // fills every slot a call does not address (must stay bit-identical)
constexpr uint16_t kConvSentinel = 0x7f7f;
constexpr uint16_t kPoison = 0xffff;     // bf16 NaN: outputs are poisoned with it before every run

inline float bf(uint16_t b) { return bf16_to_f32(b); }

// One KDA layer's inputs for a batch of T rows (tokens) and N sequences, in the engine's layout:
//   proj [T, ld_proj] = q | k | v | beta logits | pad   (the packed projection output, strided views)
//   fg   [T, ld_fg]   = f | pad(8) | gz | pad            (the low-rank second GEMMs' outputs)
struct LayerProblem {
  int N = 0, T = 0, H = 0, P = 0;
  std::vector<int32_t> cu;     // [N + 1]
  std::vector<int32_t> slots;  // [N], < 0 = padding
  int num_slots = 0;
  int64_t ld_proj = 0, ld_fg = 0, out_stride = 0;
  std::vector<uint16_t> proj, fg;   // bf16
  std::vector<uint16_t> conv_w;     // [3P, 4] bf16
  std::vector<float> A_log, dt_bias, o_norm_w;
  std::vector<float> state;         // [num_slots, H, K, V]
  std::vector<uint16_t> conv;       // [num_slots, 3, 3P]

  size_t state_slot_elems() const { return static_cast<size_t>(H) * kD * kD; }
  size_t conv_slot_elems() const { return static_cast<size_t>(3) * 3 * P; }
  int64_t q_col() const { return 0; }
  int64_t k_col() const { return P; }
  int64_t v_col() const { return 2 * P; }
  int64_t b_col() const { return 3 * P; }
  int64_t f_col() const { return 0; }
  int64_t gz_col() const { return P + 8; }
};

// Random problem: sequence lengths `lens`, slot ids a random permutation among num_slots = 2N + 3 slots,
// sequences listed in `padding` get slot -1. Unaddressed slots hold sentinels; addressed ones random state.
inline LayerProblem make_problem(const std::vector<int>& lens, int H, uint64_t seed,
                                 const std::vector<int>& padding = {}) {
  LayerProblem p;
  p.N = static_cast<int>(lens.size());
  p.H = H;
  p.P = H * kD;
  p.cu = {0};
  for (int l : lens) p.cu.push_back(p.cu.back() + l);
  p.T = p.cu.back();
  p.num_slots = 2 * p.N + 3;
  std::vector<int32_t> perm(p.num_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  p.slots.assign(perm.begin(), perm.begin() + p.N);
  for (int n : padding) p.slots[n] = -1;
  p.ld_proj = 3 * p.P + H + 8 - (H % 4);  // a multiple of 4, wider than the four slices
  p.ld_fg = 2 * p.P + 16;
  p.out_stride = p.P + 8;
  const size_t T = p.T;
  // Projections ~ N(0, 1): after the conv the q/k/v values are O(1), like real activations.
  p.proj = f32_to_bf16(ds::test::randn(T * p.ld_proj, seed + 1));
  auto fg = ds::test::randn(T * p.ld_fg, seed + 2);
  p.fg = f32_to_bf16(fg);
  p.conv_w = f32_to_bf16(ds::test::randn(static_cast<size_t>(3) * p.P * 4, seed + 3, 0.5f));
  // A_log in [0, 1.5], dt_bias ~ -2: per-step decays exp(g) mostly in 0.7..1, some strong ones.
  p.A_log = ds::test::randu(H, seed + 4, 0.0f, 1.5f);
  p.dt_bias = ds::test::randn(p.P, seed + 5, 1.0f, -2.0f);
  p.o_norm_w = ds::test::randn(kD, seed + 6, 0.2f, 1.0f);
  p.state.assign(p.num_slots * p.state_slot_elems(), kStateSentinel);
  p.conv.assign(p.num_slots * p.conv_slot_elems(), kConvSentinel);
  for (int n = 0; n < p.N; ++n) {
    if (p.slots[n] < 0) continue;
    auto s = ds::test::randn(p.state_slot_elems(), seed + 100 + n, 0.5f);
    std::copy(s.begin(), s.end(), p.state.begin() + p.slots[n] * p.state_slot_elems());
    auto c = f32_to_bf16(ds::test::randn(p.conv_slot_elems(), seed + 200 + n));
    std::copy(c.begin(), c.end(), p.conv.begin() + p.slots[n] * p.conv_slot_elems());
  }
  return p;
}

// The layer's per-token activations for rows [row0, row0 + cu.back()) of the problem, sequences `cu`
// (relative offsets): conv outputs rounded to bf16 (the activation dtype), gate g, beta, output-gate logits.
// Updates the conv pool `conv` of the addressed slots; rows of padding sequences stay zero.
struct Activations {
  std::vector<float> q, k, v, g, gz;  // [rows, P]
  std::vector<float> beta;            // [rows, H]
};
inline Activations reference_activations(const LayerProblem& p, const std::vector<int32_t>& cu,
                                         const std::vector<int32_t>& slots, int row0, std::vector<uint16_t>& conv) {
  const int N = static_cast<int>(cu.size()) - 1, T = cu.back(), H = p.H, P = p.P;
  Activations a;
  for (auto* v : {&a.q, &a.k, &a.v, &a.g, &a.gz}) v->assign(static_cast<size_t>(T) * P, 0.0f);
  a.beta.assign(static_cast<size_t>(T) * H, 0.0f);
  std::vector<float>* qkv[3] = {&a.q, &a.k, &a.v};
  for (int n = 0; n < N; ++n) {
    const int s = slots[n], len = cu[n + 1] - cu[n], t0 = row0 + cu[n];
    if (s < 0 || len == 0) continue;
    const std::vector<int32_t> cu1 = {0, len};
    for (int which = 0; which < 3; ++which) {
      std::vector<float> x(static_cast<size_t>(len) * P), w(static_cast<size_t>(P) * 4), cs(3 * P), y(x.size());
      for (int t = 0; t < len; ++t)
        for (int c = 0; c < P; ++c) x[t * P + c] = bf(p.proj[(t0 + t) * p.ld_proj + which * P + c]);
      for (int c = 0; c < P; ++c)
        for (int i = 0; i < 4; ++i) w[c * 4 + i] = bf(p.conv_w[(which * P + c) * 4 + i]);
      uint16_t* cst = conv.data() + s * p.conv_slot_elems();
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < P; ++c) cs[r * P + c] = bf(cst[r * 3 * P + which * P + c]);
      kda::short_conv_ref(x.data(), w.data(), cu1.data(), 1, P, 4, cs.data(), y.data());
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < P; ++c) cst[r * 3 * P + which * P + c] = f32_to_bf16(cs[r * P + c]);
      for (size_t i = 0; i < y.size(); ++i) (*qkv[which])[static_cast<size_t>(cu[n]) * P + i] = round_bf16(y[i]);
    }
    std::vector<float> f(static_cast<size_t>(len) * P);
    for (int t = 0; t < len; ++t) {
      const size_t row = static_cast<size_t>(cu[n] + t);
      for (int c = 0; c < P; ++c) {
        f[t * P + c] = bf(p.fg[(t0 + t) * p.ld_fg + p.f_col() + c]);
        a.gz[row * P + c] = bf(p.fg[(t0 + t) * p.ld_fg + p.gz_col() + c]);
      }
      for (int h = 0; h < H; ++h)
        a.beta[row * H + h] = 1.0f / (1.0f + std::exp(-bf(p.proj[(t0 + t) * p.ld_proj + p.b_col() + h])));
    }
    kda::gate_ref(f.data(), p.A_log.data(), p.dt_bias.data(), len, H, kD, a.g.data() + static_cast<size_t>(cu[n]) * P);
  }
  return a;
}

// Expected output [rows, P] (fp32) of the same call; updates the pools `state` and `conv` in place.
inline std::vector<float> reference_layer(const LayerProblem& p, const std::vector<int32_t>& cu,
                                          const std::vector<int32_t>& slots, int row0, std::vector<float>& state,
                                          std::vector<uint16_t>& conv) {
  const int N = static_cast<int>(cu.size()) - 1, H = p.H, P = p.P;
  const Activations a = reference_activations(p, cu, slots, row0, conv);
  std::vector<float> out(static_cast<size_t>(cu.back()) * P, 0.0f), o(out.size(), 0.0f);
  for (int n = 0; n < N; ++n) {
    const int s = slots[n], len = cu[n + 1] - cu[n];
    if (s < 0 || len == 0) continue;
    const std::vector<int32_t> cu1 = {0, len};
    const size_t off = static_cast<size_t>(cu[n]);
    kda::RecurrenceArgs r{a.q.data() + off * P, a.k.data() + off * P, a.v.data() + off * P, a.g.data() + off * P,
                          a.beta.data() + off * H, cu1.data(), 1, H, kD, kD,
                          1.0f / std::sqrt(static_cast<float>(kD)), true};
    kda::recurrent_ref(r, state.data() + s * p.state_slot_elems(), o.data() + off * P);
    kda::gated_rmsnorm_ref(o.data() + off * P, a.gz.data() + off * P, p.o_norm_w.data(), len, H, kD, 1e-5f,
                           out.data() + off * P);
  }
  return out;
}

#ifdef DELTASERVE_WITH_CUDA
template <class T>
std::vector<T> download(const DeviceBuffer& b) {
  std::vector<T> v(b.bytes() / sizeof(T));
  if (!v.empty()) CUDA_CHECK(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return v;
}

// A problem on the device: weights and pools once, the packed inputs of one call's rows at a time.
struct DeviceLayer {
  const LayerProblem& p;
  DeviceBuffer conv_w, A_log, dt_bias, o_norm_w, state, conv;
  DeviceBuffer proj, fg, slots, out;
  int rows = 0;

  explicit DeviceLayer(const LayerProblem& prob)
      : p(prob), conv_w(upload(prob.conv_w)), A_log(upload(prob.A_log)), dt_bias(upload(prob.dt_bias)),
        o_norm_w(upload(prob.o_norm_w)), state(upload(prob.state)), conv(upload(prob.conv)) {}

  // Uploads the given problem rows as the call's inputs, the slot ids, and a poisoned output [rows, stride].
  void set_rows(const std::vector<int>& row_ids, const std::vector<int32_t>& slot_ids) {
    rows = static_cast<int>(row_ids.size());
    std::vector<uint16_t> pr(static_cast<size_t>(rows) * p.ld_proj), f(static_cast<size_t>(rows) * p.ld_fg);
    for (int i = 0; i < rows; ++i) {
      std::memcpy(&pr[i * p.ld_proj], &p.proj[row_ids[i] * p.ld_proj], p.ld_proj * 2);
      std::memcpy(&f[i * p.ld_fg], &p.fg[row_ids[i] * p.ld_fg], p.ld_fg * 2);
    }
    proj = upload(pr);
    fg = upload(f);
    slots = upload(slot_ids);
    out = upload(std::vector<uint16_t>(static_cast<size_t>(std::max(rows, 1)) * p.out_stride, kPoison));
  }
  Bf16Rows view(const DeviceBuffer& b, int64_t col, int64_t ld) const {
    return {b.get<bf16_t>() + col, ld};
  }
  template <class Params>
  void fill_common(Params& k) const {
    k.H = p.H;
    k.q = view(proj, p.q_col(), p.ld_proj);
    k.k = view(proj, p.k_col(), p.ld_proj);
    k.v = view(proj, p.v_col(), p.ld_proj);
    k.beta_logits = view(proj, p.b_col(), p.ld_proj);
    k.f = view(fg, p.f_col(), p.ld_fg);
    k.gz = view(fg, p.gz_col(), p.ld_fg);
    k.slot_ids = slots.get<int32_t>();
    k.num_slots = p.num_slots;
    k.state_pool = state.get<float>();
    k.conv_pool = conv.get<bf16_t>();
    k.conv_w = conv_w.get<bf16_t>();
    k.A_log = A_log.get<float>();
    k.dt_bias = dt_bias.get<float>();
    k.o_norm_w = o_norm_w.get<float>();
    k.out = out.get<bf16_t>();
    k.out_stride = p.out_stride;
  }
  KdaDecodeParams decode_params() const {
    KdaDecodeParams k;
    fill_common(k);
    k.N = rows;
    return k;
  }
  // Output rows as fp32 [rows, P]; checks the padding columns beyond P kept the poison (never written).
  std::vector<float> output() const {
    const auto raw = download<uint16_t>(out);
    std::vector<float> o(static_cast<size_t>(rows) * p.P);
    int64_t pad_written = 0;
    for (int i = 0; i < rows; ++i) {
      for (int c = 0; c < p.P; ++c) o[i * p.P + c] = bf(raw[i * p.out_stride + c]);
      for (int64_t c = p.P; c < p.out_stride; ++c) pad_written += raw[i * p.out_stride + c] != kPoison;
    }
    EXPECT_EQ(pad_written, 0) << "output written beyond H*V columns";
    return o;
  }
};

// Pools after a call: touched slots close to the reference, every other slot bit-identical (sentinels);
// conv pool bit-exact everywhere (its new rows are copies of bf16 inputs).
inline void expect_pools(const std::string& what, const DeviceLayer& d, const std::vector<float>& state_ref,
                         const std::vector<uint16_t>& conv_ref, const std::vector<int32_t>& touched, double tol) {
  const auto st = download<float>(d.state);
  const auto cv = download<uint16_t>(d.conv);
  const size_t se = d.p.state_slot_elems();
  std::vector<float> got, want;
  for (int s = 0; s < d.p.num_slots; ++s) {
    const bool t = std::find(touched.begin(), touched.end(), s) != touched.end();
    if (t) {
      got.insert(got.end(), st.begin() + s * se, st.begin() + (s + 1) * se);
      want.insert(want.end(), state_ref.begin() + s * se, state_ref.begin() + (s + 1) * se);
    } else {
      EXPECT_EQ(std::memcmp(&st[s * se], &state_ref[s * se], se * 4), 0) << what << ": untouched slot " << s;
    }
  }
  EXPECT_CLOSE(what + ": final state", got, want, tol);
  int64_t conv_diff = 0;
  for (size_t i = 0; i < cv.size(); ++i) conv_diff += cv[i] != conv_ref[i];
  EXPECT_EQ(conv_diff, 0) << what << ": conv pool differs in " << conv_diff << " elements";
}
#endif  // DELTASERVE_WITH_CUDA

}  // namespace ds::kda::test
