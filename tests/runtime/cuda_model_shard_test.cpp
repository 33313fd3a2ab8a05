// The sharded device model plan (CPU only): which rows / columns of each checkpoint tensor every TEP and DEP
// rank holds (the ranks' blocks of a split tensor are disjoint and cover it, replicated tensors are whole on
// every rank), per-rank bytes (the 48B preset at TP 8 holds 1/8 of the experts), refusals with the numbers.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/cuda_model.h"
#include "runtime/cuda_model_plan.h"

namespace ds {
namespace {

DeviceModelOptions rank_opts(int tp, int ep, int rank) {
  DeviceModelOptions o;
  o.tp_size = tp;
  o.tp_rank = tp > 1 ? rank : 0;
  o.ep_size = ep;
  o.ep_rank = ep > 1 ? rank : 0;
  return o;
}

// Every element of every checkpoint tensor, counted over the ranks' pieces.
std::map<std::string, std::vector<int>> coverage(const ModelConfig& c, int tp, int ep, int world) {
  std::map<std::string, std::vector<int>> cov;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    cov[s.name].assign(static_cast<size_t>(n), 0);
  }
  for (int r = 0; r < world; ++r) {
    DeviceModel m;
    const devmodel::Plan plan = devmodel::plan_device_model(c, rank_opts(tp, ep, r), {}, &m);
    for (const devmodel::Dest& d : plan.dests)
      for (const devmodel::Piece& p : d.pieces) {
        const int64_t sc = p.src_cols > 0 ? p.src_cols : d.cols;
        auto& v = cov.at(p.spec.name);
        for (int64_t i = 0; i < p.rows; ++i)
          for (int64_t j = 0; j < d.cols; ++j) ++v.at(static_cast<size_t>((p.src_row0 + i) * sc + p.src_col0 + j));
      }
  }
  return cov;
}

bool replicated_in_tep(const std::string& n) {
  for (const char* k : {"embed_tokens", "lm_head", "norm.weight", "layernorm", "f_a_proj", "g_a_proj",
                        "kv_a_proj_with_mqa", "gate.weight", "e_score_correction_bias"})
    if (n.find(k) != std::string::npos) return true;
  return false;
}

TEST(CudaModelShard, TepBlocksAreDisjointAndCoverEverySplitTensor) {
  const ModelConfig c = preset_config("tiny");  // 2 KDA heads, 2 MLA heads, 8 experts, shared expert
  for (int tp : {2}) {
    const auto cov = coverage(c, tp, tp, tp);
    for (const auto& [name, v] : cov) {
      SCOPED_TRACE(name);
      int want = replicated_in_tep(name) ? tp : 1;
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(v[i], want) << "element " << i;
      }
    }
  }
}

TEST(CudaModelShard, DepSplitsOnlyTheExperts) {
  const ModelConfig c = preset_config("tiny");
  for (int ep : {2, 4, 8}) {
    const auto cov = coverage(c, 1, ep, ep);
    for (const auto& [name, v] : cov) {
      SCOPED_TRACE(name);
      const bool routed = name.find(".experts.") != std::string::npos;
      for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], routed ? 1 : ep) << "element " << i;
    }
  }
}

TEST(CudaModelShard, RankOneOfTwoHoldsTheSecondHalf) {
  ModelConfig c = preset_config("kimi-linear-48b-a3b", 4);
  c.num_experts = 16;
  DeviceModel m;
  const devmodel::Plan plan = devmodel::plan_device_model(c, rank_opts(2, 2, 1), {}, &m);
  const int64_t P = 32 * 128;
  EXPECT_EQ(m.shard.kda_heads, 16);
  EXPECT_EQ(m.shard.mla_heads, 16);
  EXPECT_EQ(m.shard.dense_I, 9216 / 2);
  EXPECT_EQ(m.shard.expert_begin, 8);
  EXPECT_EQ(m.shard.expert_end, 16);
  EXPECT_FALSE(m.shard.shared_in_moe);  // the shared expert lives on rank 0
  std::map<std::string, const devmodel::Piece*> by_name;
  std::map<std::string, const devmodel::Dest*> dest_of;
  for (const auto& d : plan.dests)
    for (const auto& p : d.pieces) {
      by_name[p.spec.name] = &p;
      dest_of[p.spec.name] = &d;
    }
  const std::string a = "model.layers.1.self_attn.";
  EXPECT_EQ(by_name.at(a + "q_proj.weight")->src_row0, P / 2);
  EXPECT_EQ(by_name.at(a + "q_proj.weight")->rows, P / 2);
  EXPECT_EQ(by_name.at(a + "b_proj.weight")->src_row0, 16);
  EXPECT_EQ(by_name.at(a + "o_proj.weight")->src_col0, P / 2);
  EXPECT_EQ(dest_of.at(a + "o_proj.weight")->cols, P / 2);
  EXPECT_EQ(by_name.at(a + "A_log")->src_col0, 16);
  EXPECT_EQ(by_name.at(a + "dt_bias")->src_col0, P / 2);
  EXPECT_FALSE(by_name.at(a + "f_a_proj.weight")->sliced(2304));
  const std::string mla = "model.layers.3.self_attn.";  // layer 4 (1-based) is MLA
  EXPECT_EQ(by_name.at(mla + "q_proj.weight")->src_row0, 16 * 192);
  EXPECT_EQ(by_name.at(mla + "kv_b_proj.weight")->src_row0, 16 * 256);
  EXPECT_EQ(by_name.at(mla + "o_proj.weight")->src_col0, 16 * 128);
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.weight")->src_col0, 9216 / 2);
  EXPECT_EQ(by_name.count("model.layers.1.block_sparse_moe.experts.7.w1.weight"), 0u);
  EXPECT_EQ(by_name.at("model.layers.1.block_sparse_moe.experts.8.w1.weight")->row0, 0);
  EXPECT_EQ(by_name.count("model.layers.1.block_sparse_moe.shared_experts.gate_proj.weight"), 0u);
  // Slice scratch: the largest whole tensor a sliced piece comes from (the dense FFN gate / up, bf16).
  EXPECT_EQ(plan.slice_scratch_bytes, size_t{9216} * 2304 * 2);
}

// Bytes of the plan's destinations whose name contains `what`.
size_t dest_bytes(const devmodel::Plan& p, const std::string& what) {
  size_t b = 0;
  for (const auto& d : p.dests)
    if (d.what.find(what) != std::string::npos) b += d.data_bytes() + d.scale_bytes();
  return b;
}

TEST(CudaModelShard, Preset48BAtTp8HoldsAnEighthOfTheExperts) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  for (bool fp8 : {false, true}) {
    DeviceModelOptions o1;
    o1.fp8 = fp8;
    DeviceModel m1;
    const devmodel::Plan whole = devmodel::plan_device_model(c, o1, {}, &m1);
    const size_t experts1 = dest_bytes(whole, "MoE experts");
    size_t sum = 0;
    for (int r = 0; r < 8; ++r) {
      DeviceModelOptions o = rank_opts(8, 8, r);
      o.fp8 = fp8;
      DeviceModel m;
      const devmodel::Plan plan = devmodel::plan_device_model(c, o, {}, &m);
      EXPECT_EQ(dest_bytes(plan, "MoE experts"), experts1 / 8);
      EXPECT_EQ(device_model_bytes(c, o), plan.bytes);
      sum += plan.bytes;
      if (r == 0)
        std::printf("[shard] 48B %s: TP 1 %.2f GB, TP 8 rank 0 %.2f GB (experts %.2f -> %.2f GB)\n",
                    fp8 ? "fp8" : "bf16", whole.bytes / 1e9, plan.bytes / 1e9, experts1 / 1e9,
                    dest_bytes(plan, "MoE experts") / 1e9);
      EXPECT_LT(plan.bytes, whole.bytes / 8 + (size_t{2} << 30));  // + replicated embedding, lm_head, routers
    }
    EXPECT_GT(sum, whole.bytes);  // replicated tensors count once per rank
  }
}

TEST(CudaModelShard, RefusesWhatDoesNotSplit) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  auto why = [&](DeviceModelOptions o) {
    auto r = device_shard_unsupported(c, o);
    return r ? *r : std::string();
  };
  EXPECT_NE(why(rank_opts(3, 3, 0)).find("32 KDA heads do not split over tp 3"), std::string::npos) << why(rank_opts(3, 3, 0));
  EXPECT_NE(why(rank_opts(2, 1, 0)).find("ep == tp"), std::string::npos);
  EXPECT_NE(why(rank_opts(1, 3, 0)).find("256 experts do not split over ep 3"), std::string::npos);
  EXPECT_NE(why(rank_opts(2, 2, 2)).find("rank 2 of 2"), std::string::npos);
  EXPECT_EQ(why(rank_opts(8, 8, 7)), "");
  EXPECT_EQ(why(rank_opts(1, 8, 3)), "");
  EXPECT_THROW(device_model_bytes(c, rank_opts(3, 3, 0)), Error);
  ModelConfig odd = preset_config("kimi-linear-48b-a3b", 4);
  odd.intermediate_size = 9217;  // odd: no even split (the check is arithmetic only)
  EXPECT_EQ(why(DeviceModelOptions{}), "");
  auto r = device_shard_unsupported(odd, rank_opts(2, 2, 0));
  ASSERT_TRUE(r);
  EXPECT_NE(r->find("9217"), std::string::npos) << *r;
}

}  // namespace
}  // namespace ds
