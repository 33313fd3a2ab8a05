// Safetensors writer/reader round trips, the reference layout, sharded indexes and rejection of broken files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "tests/test_util.h"
#include "model/safetensors.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A file image from a header string and `data_bytes` bytes of data (0, 1, 2, ...).
std::vector<uint8_t> make_image(const std::string& header, size_t data_bytes) {
  // Sized up front and filled with memcpy: g++ 12 warns falsely (-Warray-bounds) on inserts into a fresh vector.
  std::vector<uint8_t> b(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) b[8 + header.size() + i] = static_cast<uint8_t>(i);
  return b;
}

std::string parse_error(const std::vector<uint8_t>& img) {
  try {
    parse_safetensors_header(img.data(), img.size(), "bad.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(msg, fragment) EXPECT_NE((msg).find(fragment), std::string::npos) << "expected '" << (fragment) << "' in: " << (msg)

// Deterministic contents for a tensor of any dtype.
HostTensor filled(DType t, std::vector<int64_t> dims, int salt) {
  HostTensor h(t, std::move(dims));
  for (size_t i = 0; i < h.nbytes(); ++i) h.bytes()[i] = static_cast<uint8_t>(i * 31 + salt * 7 + 1);
  return h;
}

TEST(Safetensors, RoundTripsEveryDtype) {
  test::TempDir dir;
  const DType all[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2,
                       DType::kE8M0, DType::kF4E2M1, DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                       DType::kU8, DType::kBool};
  std::vector<HostTensor> keep;
  std::vector<std::pair<std::string, TensorView>> tensors;
  int salt = 0;
  for (DType t : all) {
    // Odd element counts (fp4: 15 values in 8 bytes), a scalar and an empty tensor per dtype.
    keep.push_back(filled(t, {3, 5}, salt++));
    tensors.emplace_back(fmt::format("t.{}.a", dtype_name(t)), keep.back().view());
    keep.push_back(filled(t, {}, salt++));
    tensors.emplace_back(fmt::format("t.{}.scalar", dtype_name(t)), keep.back().view());
    keep.push_back(filled(t, {0, 4}, salt++));
    tensors.emplace_back(fmt::format("t.{}.empty", dtype_name(t)), keep.back().view());
  }
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "round trip");
  ASSERT_EQ(f->names().size(), tensors.size());
  for (const auto& [name, v] : tensors) {
    const TensorView r = f->view(name);
    EXPECT_EQ(r.dtype, v.dtype) << name;
    EXPECT_EQ(r.dims(), v.dims()) << name;
    ASSERT_EQ(r.nbytes(), v.nbytes()) << name;
    if (v.nbytes()) {
      EXPECT_EQ(std::memcmp(r.data, v.data, v.nbytes()), 0) << name;
    }
    // The writer's ordering keeps every tensor aligned to its element size.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data) % dtype_size(r.dtype), 0u) << name;
    EXPECT_EQ(f->info(name).end - f->info(name).begin, v.nbytes()) << name;
  }
  EXPECT_FALSE(fs::exists(path + fmt::format(".tmp.{}", ::getpid())));
}

TEST(Safetensors, MatchesTheReferenceLayout) {
  // The reference writer's own test case: one F32 [1, 1, 2, 3] tensor "attn0" with values 0..5. Its JSON
  // header is 65 bytes, padded with spaces to 72 so the data starts 8-aligned.
  test::TempDir dir;
  float vals[6] = {0, 1, 2, 3, 4, 5};
  write_safetensors(dir.file("ref.safetensors"), {{"attn0", TensorView(vals, DType::kF32, {1, 1, 2, 3})}});
  const std::string json = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(json.size(), 65u);
  std::string want(8, '\0');
  want[0] = 72;
  want += json + std::string(72 - json.size(), ' ');
  want.append(reinterpret_cast<const char*>(vals), sizeof(vals));
  const std::vector<uint8_t> got = read_bytes(dir.file("ref.safetensors"));
  EXPECT_EQ(std::string(got.begin(), got.end()), want);
}

TEST(Safetensors, OrdersByAlignmentThenName) {
  test::TempDir dir;
  std::vector<HostTensor> keep;
  std::vector<std::pair<std::string, TensorView>> tensors;
  const std::pair<const char*, DType> items[] = {{"a.fp4", DType::kF4E2M1}, {"b.f32", DType::kF32},
                                                 {"c.f16", DType::kF16},   {"d.f64", DType::kF64},
                                                 {"e.bf16", DType::kBF16}, {"a.f32", DType::kF32},
                                                 {"f.e4m3", DType::kF8E4M3}};
  for (auto [name, t] : items) {
    keep.push_back(filled(t, {3}, 0));
    tensors.emplace_back(name, keep.back().view());
  }
  write_safetensors(dir.file("o.safetensors"), tensors);
  auto f = SafetensorsFile::open(dir.file("o.safetensors"));
  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (const auto& n : f->names()) by_offset.emplace_back(f->info(n).begin, n);
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<std::string> order;
  for (auto& p : by_offset) order.push_back(p.second);
  EXPECT_EQ(order, (std::vector<std::string>{"d.f64", "a.f32", "b.f32", "e.bf16", "c.f16", "f.e4m3", "a.fp4"}));
}

TEST(Safetensors, WritesStridedViewsDensely) {
  test::TempDir dir;
  HostTensor t(DType::kF32, {4, 6});
  for (int i = 0; i < 24; ++i) t.ptr<float>()[i] = static_cast<float>(i);
  write_safetensors(dir.file("s.safetensors"), {{"cols", t.view().slice_last(2, 3)}});
  auto f = SafetensorsFile::open(dir.file("s.safetensors"));
  const TensorView v = f->view("cols");
  ASSERT_EQ(v.dims(), (std::vector<int64_t>{4, 3}));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(load_as_f32(v.data, DType::kF32, r * 3 + c), r * 6 + 2 + c);
}

TEST(Safetensors, WriterRejectsBadInputAndLeavesNoFile) {
  test::TempDir dir;
  float x[2] = {1, 2};
  const TensorView v(x, DType::kF32, {2});
  const std::string path = dir.file("w.safetensors");
  try {
    write_safetensors(path, {{"a", v}, {"a", v}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "tensor 'a': duplicate name");
  }
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", v}}), Error);
  // A producer that hands back the wrong shape aborts the write; neither the file nor the temp file remain.
  try {
    write_safetensors_streaming(path, {{"a", DType::kF32, {3}}}, [&](size_t) { return v; });
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "tensor 'a': produced f32 [2] but the header says f32 [3]");
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir.file("")));
}

TEST(Safetensors, OpensShardedCheckpoints) {
  test::TempDir dir;
  float a[2] = {1, 2}, b[3] = {3, 4, 5};
  uint16_t c[1] = {0x3f80};
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", TensorView(a, DType::kF32, {2})},
                                                                   {"unlisted", TensorView(a, DType::kF32, {2})}});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                    {{"b", TensorView(b, DType::kF32, {3})}, {"c", TensorView(c, DType::kBF16, {1})}});
  nlohmann::json idx = {{"metadata", {{"total_size", 22}}},
                        {"weight_map", {{"a", "model-00001-of-00002.safetensors"},
                                        {"b", "model-00002-of-00002.safetensors"},
                                        {"c", "model-00002-of-00002.safetensors"}}}};
  const std::string index = dir.file("model.safetensors.index.json");
  std::ofstream(index) << idx.dump();
  SafetensorsShards s = open_safetensors_index(index);
  EXPECT_EQ(s.files.size(), 2u);
  ASSERT_EQ(s.tensor_file.size(), 3u);
  EXPECT_EQ(load_as_f32(s.tensor_file.at("b")->view("b").data, DType::kF32, 2), 5.0f);
  EXPECT_EQ(s.tensor_file.at("a")->view("a").dims(), std::vector<int64_t>{2});
  EXPECT_EQ(s.tensor_file.count("unlisted"), 0u);

  auto error_for = [&](const nlohmann::json& j) -> std::string {
    std::ofstream(index, std::ios::trunc) << j.dump();
    try {
      open_safetensors_index(index);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  nlohmann::json missing_tensor = idx;
  missing_tensor["weight_map"]["d"] = "model-00002-of-00002.safetensors";
  std::string m = error_for(missing_tensor);
  EXPECT_HAS(m, index);
  EXPECT_HAS(m, "tensor 'd' is listed in the index but missing from shard");
  EXPECT_HAS(m, "model-00002-of-00002.safetensors");
  nlohmann::json missing_shard = idx;
  missing_shard["weight_map"]["b"] = "model-00003-of-00002.safetensors";
  m = error_for(missing_shard);
  EXPECT_HAS(m, "shard 'model-00003-of-00002.safetensors' (listed for tensor 'b')");
  EXPECT_HAS(m, "cannot open");
  nlohmann::json escape = idx;
  escape["weight_map"]["b"] = "../model-00002-of-00002.safetensors";
  EXPECT_HAS(error_for(escape), "must be a file name inside the checkpoint folder");
  EXPECT_HAS(error_for(nlohmann::json{{"metadata", {}}}), "missing \"weight_map\"");
  std::ofstream(index, std::ios::trunc) << "{\"weight_map\": {";
  EXPECT_THROW(open_safetensors_index(index), Error);
}

TEST(Safetensors, RejectsTruncatedFilesAtEveryCut) {
  test::TempDir dir;
  // w.a (f32) precedes w.b (bf16) both in the file (alignment order) and in the header's key order, so a cut
  // inside the data is reported against the first tensor it breaks.
  HostTensor a = filled(DType::kF32, {5}, 1), b = filled(DType::kBF16, {16, 8}, 2);
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, {{"w.a", a.view()}, {"w.b", b.view()}});
  const std::vector<uint8_t> img = read_bytes(good);
  ASSERT_NO_THROW(SafetensorsFile::open(good));
  const size_t data0 = img.size() - a.nbytes() - b.nbytes();  // data section start
  struct Cut { size_t at; const char* fragment; };
  const Cut cuts[] = {{0, "shorter than the 8-byte header length"},
                      {5, "shorter than the 8-byte header length"},
                      {8, "runs past the end"},
                      {8 + 10, "runs past the end"},
                      {data0 - 1, "runs past the end"},
                      {data0, "tensor 'w.a': data_offsets [0, 20] run past"},
                      {data0 + 4, "tensor 'w.a'"},
                      {data0 + a.nbytes() + 3, "tensor 'w.b'"},
                      {img.size() - 1, "tensor 'w.b': data_offsets [20, 276] run past the end of the data section (275 bytes"}};
  for (const Cut& c : cuts) {
    const std::string p = dir.file(fmt::format("cut{}.safetensors", c.at));
    write_bytes(p, std::vector<uint8_t>(img.begin(), img.begin() + static_cast<std::ptrdiff_t>(c.at)));
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << "cut at " << c.at << " was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_HAS(m, p);
      EXPECT_HAS(m, c.fragment);
    }
  }
}

TEST(Safetensors, RejectsBadHeaderLengths) {
  std::vector<uint8_t> img = make_image("{}", 0);
  EXPECT_EQ(parse_error(img), "");
  const uint64_t huge = 200'000'000;
  std::memcpy(img.data(), &huge, 8);
  EXPECT_HAS(parse_error(img), "bad.safetensors: header length 200000000 exceeds the 100000000-byte limit");
  const uint64_t past = 3;
  std::memcpy(img.data(), &past, 8);
  EXPECT_HAS(parse_error(img), "header length 3 runs past the end of the 10-byte file");
  const uint64_t tiny = 1;
  std::memcpy(img.data(), &tiny, 8);
  EXPECT_HAS(parse_error(img), "header length 1 is too small");
  const uint64_t max = ~0ull;
  std::memcpy(img.data(), &max, 8);
  EXPECT_HAS(parse_error(img), "exceeds the");
}

TEST(Safetensors, RejectsMalformedHeaders) {
  const std::string e = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  struct Case { std::string header; size_t data; const char* fragment; };
  const Case cases[] = {
      {"{\"a\":", 0, "bad.safetensors: header is not valid JSON"},
      {"[1,2]", 0, "header must be a JSON object, got array"},
      {"{\"a\":{" + e + "}}\xff", 8, "not valid JSON"},
      {R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'w': unknown dtype \"F12\""},
      {R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'w': missing or non-string \"dtype\""},
      {R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8, "tensor 'w': missing or non-array \"shape\""},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "tensor 'w': shape element -2"},
      {R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8, "tensor 'w': shape element 2.0"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "tensor 'w': \"data_offsets\" must be an array"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "tensor 'w': data_offsets [8, 0]: begin > end"},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8"},
      {R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 8, "tensor 'w': shape [3] of F4 needs 2 bytes"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "tensor 'w': data_offsets [0, 8] run past"},
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}})", 8, "tensor 'w': shape"},
      {R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"v":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
       16, "tensor 'v' bytes [6, 10) overlap tensor 'w' bytes [0, 8)"},
      {R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"w":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})",
       16, "tensor 'w': duplicate name"},
      {R"({"w":{"dtype":"U8","dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 8, "duplicate key 'dtype'"},
      {R"({"w":{"dtype":"U8","shape":[[8]],"data_offsets":[0,8]}})", 8, "nests deeper"},
      {"{\"w\":" + std::string(5000, '[') + std::string(5000, ']') + "}", 8, "nests deeper"},
      {R"({"__metadata__":{"format":1}})", 0, "__metadata__ entry 'format' must be a string"},
      {R"({"__metadata__":[1]})", 0, "__metadata__ must be an object"},
      {R"({"w":[1]})", 0, "tensor 'w': entry must be an object"},
  };
  for (const Case& c : cases) {
    const std::string m = parse_error(make_image(c.header, c.data));
    EXPECT_HAS(m, "bad.safetensors");
    EXPECT_HAS(m, c.fragment);
  }
}

TEST(Safetensors, AcceptsEdgeCasesTheFormatAllows) {
  // Empty tensors may share an offset; padding spaces, a null __metadata__ and unlisted tail bytes are fine.
  const std::string h =
      R"({"__metadata__":null,"e1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
      R"("e2":{"dtype":"BF16","shape":[3,0],"data_offsets":[4,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"
      "   ";
  const auto img = make_image(h, 6);
  const SafetensorsHeader hd = parse_safetensors_header(img.data(), img.size(), "ok");
  ASSERT_EQ(hd.tensors.size(), 3u);
  EXPECT_EQ(hd.tensors[0].name, "x");  // sorted by offset
  EXPECT_EQ(hd.data_offset, 8 + h.size());
}

TEST(Safetensors, ViewAndInfoNameTheFileAndTensor) {
  test::TempDir dir;
  write_bytes(dir.file("v.safetensors"),
              make_image(R"({"x":{"dtype":"U8","shape":[1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1));
  auto f = SafetensorsFile::open(dir.file("v.safetensors"));
  try {
    f->info("y");
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), dir.file("v.safetensors") + ": tensor 'y' not found");
  }
  try {
    f->view("x");  // rank 7: valid in the format, beyond TensorView's 6 dims
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "tensor 'x': rank 7 exceeds");
  }
  EXPECT_THROW(SafetensorsFile::open(dir.file("absent.safetensors")), Error);
  EXPECT_THROW(SafetensorsFile::open(dir.file("")), Error);  // a directory
}

}  // namespace
}  // namespace ds
