// make-model -> load -> generate: deterministic for a seed, another seed differs, the embedded seed reproduces the
// embedded model; tokenizer files of the real shape; clear refusals.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/embedded.h"
#include "runtime/cpu_engine.h"
#include "runtime/model_files.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("ds_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Generates through the engine (as `deltaserve generate` does): sampled, fixed seed, 20 tokens.
std::vector<int32_t> generate(const LoadedModel& m, const std::string& text) {
  auto model = std::make_shared<const CpuModel>(m.config, m.weights);
  CpuEngineOptions o;
  o.max_seqs = 1;
  o.eos_token_ids = m.eos_token_ids();
  CpuEngine e(model, o);
  SamplingParams p;
  p.max_tokens = 20, p.temperature = 0.8f, p.top_p = 0.9f, p.seed = 1234, p.ignore_eos = true;
  e.add_request({m.tokenizer->encode(text), p});
  std::vector<int32_t> out;
  while (e.has_work())
    for (const auto& r : e.step()) out.insert(out.end(), r.new_tokens.begin(), r.new_tokens.end());
  return out;
}

TEST(ModelFiles, MakeLoadGenerateIsDeterministic) {
  TempDir a("mm_a"), b("mm_b"), c("mm_c");
  make_model_dir({"tiny", 0, 7, a.str()});
  make_model_dir({"tiny", 0, 7, b.str()});
  make_model_dir({"tiny", 0, 8, c.str()});
  for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(a.path() / f)) << f;

  const LoadedModel ma = load_model(a.str()), mb = load_model(b.str()), mc = load_model(c.str());
  EXPECT_EQ(ma.tokenizer->kind(), "byte");
  EXPECT_EQ(ma.config, preset_config("tiny"));
  const auto ta = generate(ma, "Hello"), ta2 = generate(ma, "Hello"), tb = generate(mb, "Hello"),
             tc = generate(mc, "Hello");
  EXPECT_EQ(ta.size(), 20u);
  EXPECT_EQ(ta, ta2);  // same model, same seed: same tokens
  EXPECT_EQ(ta, tb);   // same make-model seed: same weights, same tokens
  EXPECT_NE(ta, tc);   // another weight seed: other tokens
  // Stop ids of the byte tokenizer + config eos.
  EXPECT_EQ(ma.eos_token_ids(), (std::vector<int32_t>{258, 257}));
}

TEST(ModelFiles, EmbeddedSeedCheckpointReproducesTheEmbeddedModel) {
  TempDir d("mm_emb");
  make_model_dir({"tiny", 0, kEmbeddedSeed, d.str()});
  const LoadedModel file = load_model(d.str()), embedded = load_model("");
  EXPECT_EQ(embedded.name, kEmbeddedModelName);
  EXPECT_EQ(generate(file, "deltaserve"), generate(embedded, "deltaserve"));  // bf16 round trip is lossless
}

TEST(ModelFiles, RealShapeTokenizerFilesAndClearRefusal) {
  TempDir d("mm_tik");
  write_byte_level_tiktoken_files(d.str());
  std::ifstream f(d.path() / "tiktoken.model");
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 256u);
  EXPECT_EQ(lines[0], "AA== 0");
  EXPECT_EQ(lines['A'], "QQ== 65");
  EXPECT_EQ(lines[255], "/w== 255");
  const auto cfg = nlohmann::json::parse(std::ifstream(d.path() / "tokenizer_config.json"));
  EXPECT_EQ(cfg["added_tokens_decoder"]["163586"]["content"], "<|im_end|>");
  EXPECT_EQ(cfg["added_tokens_decoder"]["163601"]["content"], "<|im_middle|>");
  EXPECT_EQ(cfg["added_tokens_decoder"]["163600"]["content"], "<|reserved_token_163600|>");
  EXPECT_EQ(cfg["added_tokens_decoder"].size(), 256u);

  // A checkpoint whose tokenizer cannot be loaded yet is refused naming tiktoken, before any weight is read.
  try {
    load_model(d.str());
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiktoken"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model((d.path() / "missing").string()), Error);
  EXPECT_THROW(make_model_dir({"no-such-preset", 0, 1, d.str()}), Error);
}

}  // namespace
}  // namespace ds
