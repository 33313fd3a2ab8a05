// `deltaserve op kda-decode|kda-prefill`: runs one KDA op on tensors read from a safetensors file, on the CPU
// reference or the CUDA kernels, and writes the output and the updated state pools to another file (for
// cross-checking against other engines' kernels on the same inputs).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "app/commands.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_ref.h"
#include "model/safetensors.h"
#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace {

using namespace ds;

constexpr const char* kTensorHelp = R"(
Tensors of --in (row-major; R = rows: N sequences for kda-decode, T tokens for kda-prefill; H heads,
P = H*128, S = pool slots):
  q, k, v      bf16 [R, P]            pre-conv projections
  beta_logits  bf16 [R, H]            beta before the sigmoid
  f            bf16 [R, P]            forget-gate logits (before dt_bias)
  gz           bf16 [R, P]            output-gate logits
  slot_ids     i32  [N]               pool slot per sequence; < 0 = padding (output zero, no state touched)
  cu_seqlens   i32  [N + 1]           kda-prefill only: token offsets of the sequences
  state        f32  [S, H, 128, 128]  recurrent state pool (key-major)
  conv_state   bf16 [S, 3, 3P]        conv state pool (q|k|v channels, oldest row first)
  conv_w       bf16 [3P, 4]           depthwise conv weights (q|k|v)
  A_log        f32  [H]
  dt_bias      f32  [P]
  o_norm_w     f32  [128]
--out gets: out bf16 [R, P] (gated-normed output), and state, conv_state after the op.)";

struct OpData {
  bool prefill = false;
  int R = 0, N = 0, H = 0, P = 0, S = 0;
  std::shared_ptr<SafetensorsFile> file;
  std::vector<int32_t> cu, slots;
  HostTensor state, conv, out;
};

TensorView input(const OpData& d, const std::string& name, DType dtype, std::vector<int64_t> shape) {
  const TensorView v = d.file->view(name);
  CHECK(v.dtype == dtype, "{}: tensor '{}' is {}, expected {}", d.file->path(), name, dtype_name(v.dtype),
        dtype_name(dtype));
  CHECK(v.dims() == shape, "{}: tensor '{}' has shape {}, expected {} entries of the documented shape",
        d.file->path(), name, v.shape_str(), shape.size());
  return v;
}

HostTensor copy_of(const TensorView& v) {
  HostTensor t(v.dtype, v.dims());
  std::memcpy(t.bytes(), v.data, t.nbytes());
  return t;
}

OpData load(const std::string& path, bool prefill) {
  OpData d;
  d.prefill = prefill;
  d.file = SafetensorsFile::open(path);
  const TensorView q = d.file->view("q");
  CHECK(q.ndim == 2, "{}: q must be [rows, P], got {}", path, q.shape_str());
  d.R = static_cast<int>(q.size(0));
  d.P = static_cast<int>(q.size(1));
  const TensorView A = d.file->view("A_log");
  d.H = static_cast<int>(A.numel());
  CHECK(d.P == d.H * kda::kHeadDim, "{}: P={} is not H*128 with H={} (from A_log)", path, d.P, d.H);
  const TensorView st = d.file->view("state");
  d.S = st.ndim == 4 ? static_cast<int>(st.size(0)) : 0;
  const TensorView slots = d.file->view("slot_ids");
  d.N = static_cast<int>(slots.numel());
  input(d, "slot_ids", DType::kI32, {d.N});
  d.slots.assign(slots.ptr<int32_t>(), slots.ptr<int32_t>() + d.N);
  if (prefill) {
    input(d, "cu_seqlens", DType::kI32, {d.N + 1});
    const TensorView cu = d.file->view("cu_seqlens");
    d.cu.assign(cu.ptr<int32_t>(), cu.ptr<int32_t>() + d.N + 1);
    CHECK(d.cu.front() == 0 && d.cu.back() == d.R, "{}: cu_seqlens must run from 0 to T={}", path, d.R);
  } else {
    CHECK(d.N == d.R, "{}: kda-decode takes one row per sequence, but slot_ids has {} entries and q {} rows",
          path, d.N, d.R);
    for (int n = 0; n <= d.N; ++n) d.cu.push_back(n);
  }
  for (const char* n : {"q", "k", "v", "f", "gz"}) input(d, n, DType::kBF16, {d.R, d.P});
  input(d, "beta_logits", DType::kBF16, {d.R, d.H});
  input(d, "conv_w", DType::kBF16, {3 * d.P, kda::kConvWidth});
  input(d, "A_log", DType::kF32, {d.H});
  input(d, "dt_bias", DType::kF32, {d.P});
  input(d, "o_norm_w", DType::kF32, {kda::kHeadDim});
  d.state = copy_of(input(d, "state", DType::kF32, {d.S, d.H, kda::kHeadDim, kda::kHeadDim}));
  d.conv = copy_of(input(d, "conv_state", DType::kBF16, {d.S, kda::kConvWidth - 1, 3 * d.P}));
  for (int32_t s : d.slots) CHECK(s < d.S, "{}: slot id {} >= {} pool slots", path, s, d.S);
  d.out = HostTensor(DType::kBF16, {d.R, d.P});
  return d;
}

// fp32 rows [t0, t0 + len) of columns [c0, c0 + width) of a 2-D tensor.
std::vector<float> rows_f32(const TensorView& v, int t0, int len, int64_t c0, int64_t width) {
  std::vector<float> r(static_cast<size_t>(len) * width);
  for (int t = 0; t < len; ++t)
    for (int64_t c = 0; c < width; ++c)
      r[t * width + c] = load_as_f32(v.data, v.dtype, (t0 + t) * v.stride(0) + c0 + c);
  return r;
}

// The CPU reference of the whole layer: conv (rounded to bf16, the activation dtype), gate, beta, the
// token-by-token recurrence and the gated RMSNorm, sequence by sequence.
void run_cpu(OpData& d, float eps) {
  const int H = d.H, P = d.P, D = kda::kHeadDim;
  const TensorView conv_w = d.file->view("conv_w");
  const std::vector<float> A_log = rows_f32(d.file->view("A_log"), 0, 1, 0, H);
  const std::vector<float> dt = rows_f32(d.file->view("dt_bias"), 0, 1, 0, P);
  const std::vector<float> onw = rows_f32(d.file->view("o_norm_w"), 0, 1, 0, D);
  const size_t conv_slot = static_cast<size_t>(3) * 3 * P;
  for (int n = 0; n < d.N; ++n) {
    const int s = d.slots[n], t0 = d.cu[n], len = d.cu[n + 1] - t0;
    if (s < 0 || len == 0) continue;
    const std::vector<int32_t> cu1 = {0, len};
    std::vector<float> qkv[3];
    const char* names[3] = {"q", "k", "v"};
    for (int which = 0; which < 3; ++which) {
      std::vector<float> x = rows_f32(d.file->view(names[which]), t0, len, 0, P), y(x.size());
      std::vector<float> w(static_cast<size_t>(P) * 4), cs(static_cast<size_t>(3) * P);
      for (int i = 0; i < P * 4; ++i) w[i] = load_as_f32(conv_w.data, DType::kBF16, which * P * 4 + i);
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < P; ++c) cs[r * P + c] = d.conv.get_f32(s * conv_slot + r * 3 * P + which * P + c);
      kda::short_conv_ref(x.data(), w.data(), cu1.data(), 1, P, 4, cs.data(), y.data());
      for (auto& e : y) e = round_bf16(e);
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < P; ++c) d.conv.set_f32(s * conv_slot + r * 3 * P + which * P + c, cs[r * P + c]);
      qkv[which] = std::move(y);
    }
    const std::vector<float> f = rows_f32(d.file->view("f"), t0, len, 0, P);
    const std::vector<float> gz = rows_f32(d.file->view("gz"), t0, len, 0, P);
    std::vector<float> beta = rows_f32(d.file->view("beta_logits"), t0, len, 0, H), g(f.size()), o(f.size()),
                       out(f.size());
    for (auto& b : beta) b = 1.0f / (1.0f + std::exp(-b));
    kda::gate_ref(f.data(), A_log.data(), dt.data(), len, H, D, g.data());
    const kda::RecurrenceArgs a{qkv[0].data(), qkv[1].data(), qkv[2].data(), g.data(), beta.data(), cu1.data(),
                                1, H, D, D, 1.0f / std::sqrt(static_cast<float>(D)), true};
    kda::recurrent_ref(a, d.state.ptr<float>() + static_cast<size_t>(s) * H * D * D, o.data());
    kda::gated_rmsnorm_ref(o.data(), gz.data(), onw.data(), len, H, D, eps, out.data());
    for (size_t i = 0; i < out.size(); ++i) d.out.set_f32(static_cast<size_t>(t0) * P + i, out[i]);
  }
}

#ifdef DELTASERVE_WITH_CUDA
void run_cuda(OpData& d, float eps) {
  std::vector<std::pair<std::string, DeviceBuffer>> bufs;
  auto dev = [&](const std::string& name) -> void* {
    const TensorView v = d.file->view(name);
    bufs.emplace_back(name, upload(v.data, v.nbytes()));
    return bufs.back().second.get();
  };
  auto rows = [&](const std::string& name, int64_t stride) {
    return kda::Bf16Rows{static_cast<const bf16_t*>(dev(name)), stride};
  };
  DeviceBuffer state = upload(d.state.bytes(), d.state.nbytes());
  DeviceBuffer conv = upload(d.conv.bytes(), d.conv.nbytes());
  DeviceBuffer out(d.out.nbytes()), slots = upload(d.slots.data(), d.slots.size() * 4);
  auto fill = [&](auto& p) {
    p.H = d.H;
    p.q = rows("q", d.P), p.k = rows("k", d.P), p.v = rows("v", d.P), p.f = rows("f", d.P), p.gz = rows("gz", d.P);
    p.beta_logits = rows("beta_logits", d.H);
    p.slot_ids = slots.get<int32_t>();
    p.num_slots = d.S;
    p.state_pool = state.get<float>();
    p.conv_pool = conv.get<bf16_t>();
    p.conv_w = static_cast<const bf16_t*>(dev("conv_w"));
    p.A_log = static_cast<const float*>(dev("A_log"));
    p.dt_bias = static_cast<const float*>(dev("dt_bias"));
    p.o_norm_w = static_cast<const float*>(dev("o_norm_w"));
    p.norm_eps = eps;
    p.out = out.get<bf16_t>();
    p.out_stride = d.P;
  };
  if (d.prefill) {
    kda::KdaPrefillParams p;
    fill(p);
    const auto off = kda::kda_chunk_offsets(d.cu);
    DeviceBuffer cu = upload(d.cu.data(), d.cu.size() * 4), co = upload(off.data(), off.size() * 4);
    p.N = d.N, p.T = d.R, p.cu_seqlens = cu.get<int32_t>(), p.chunk_offsets = co.get<int32_t>();
    p.num_chunks = off.back();
    p.workspace_bytes = kda::kda_prefill_workspace_bytes(p.num_chunks, d.H);
    DeviceBuffer ws(p.workspace_bytes);
    p.workspace = ws.get();
    kda::kda_prefill(p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    kda::KdaDecodeParams p;
    fill(p);
    p.N = d.N;
    kda::kda_decode(p, kda::kda_decode_setup(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  CUDA_CHECK(cudaMemcpy(d.out.bytes(), out.get(), d.out.nbytes(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(d.state.bytes(), state.get(), d.state.nbytes(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(d.conv.bytes(), conv.get(), d.conv.nbytes(), cudaMemcpyDeviceToHost));
}
#endif

void setup(CLI::App& app) {
  struct Opts {
    std::string op, in, out, device = "auto";
    float eps = 1e-5f;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("op", std::string("Run one kernel op on tensors from a safetensors file: "
                                                   "kda-decode | kda-prefill") + kTensorHelp);
  cmd->add_option("name", o->op, "kda-decode | kda-prefill")
      ->required()
      ->check(CLI::IsMember({"kda-decode", "kda-prefill"}));
  cmd->add_option("--in", o->in, "input safetensors file")->required();
  cmd->add_option("--out", o->out, "output safetensors file")->required();
  cmd->add_option("--device", o->device, "cpu (fp32 reference) | cuda | auto (cuda when present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--eps", o->eps, "gated RMSNorm eps (rms_norm_eps)");
  cmd->callback([o] {
    OpData d = load(o->in, o->op == "kda-prefill");
    const bool cuda = o->device == "cuda" || (o->device == "auto" && cuda_device_available());
    if (cuda) {
#ifdef DELTASERVE_WITH_CUDA
      CHECK(cuda_device_available(), "--device cuda: no CUDA GPU present");
      run_cuda(d, o->eps);
#else
      DS_THROW("--device cuda: this build has no CUDA support");
#endif
    } else {
      run_cpu(d, o->eps);
    }
    write_safetensors(o->out, {{"out", d.out.view()}, {"state", d.state.view()}, {"conv_state", d.conv.view()}},
                      {{"op", o->op}, {"device", cuda ? "cuda" : "cpu"}});
    std::printf("%s on %s: %d rows, H=%d -> %s\n", o->op.c_str(), cuda ? "cuda" : "cpu", d.R, d.H, o->out.c_str());
  });
}

}  // namespace

DS_REGISTER_COMMAND(60, setup);
