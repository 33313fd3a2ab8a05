// Tokenizer-independent parts: decode, UTF-8 replacement decoding, streaming, Kimi chat format, loader.
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/byte_tokenizer.h"

namespace ds {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Allowed range of the k-th continuation byte (k >= 1) after lead byte b (Unicode Table 3-7, well-formed UTF-8).
bool continuation_ok(unsigned char lead, int k, unsigned char c) {
  if (k == 1) {
    if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;  // no overlong 3-byte forms
    if (lead == 0xED) return c >= 0x80 && c <= 0x9F;  // no surrogates
    if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;  // no overlong 4-byte forms
    if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;  // <= U+10FFFF
  }
  return c >= 0x80 && c <= 0xBF;
}

// Total length of the sequence a lead byte starts, 0 if it can start none.
int sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

}  // namespace

size_t utf8_decode_replace(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    const int len = sequence_length(lead);
    if (len == 1) {
      out->push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    if (len == 0) {  // stray continuation byte, C0/C1, F5..FF
      out->append(kReplacement);
      ++i;
      continue;
    }
    int k = 1;
    while (k < len && i + k < n && continuation_ok(lead, k, static_cast<unsigned char>(bytes[i + k]))) ++k;
    if (k == len) {
      out->append(bytes.substr(i, len));
      i += len;
    } else if (i + k == n && !final) {
      return i;  // a valid prefix so far: wait for the next bytes
    } else {
      out->append(kReplacement);  // maximal subpart [i, i + k) is one replacement character
      i += k;
    }
  }
  return i;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  std::string out;
  utf8_decode_replace(bytes, /*final=*/true, &out);
  return out;
}

std::vector<int32_t> Tokenizer::stop_token_ids() const {
  std::vector<int32_t> ids;
  for (int32_t id : {specials().im_end, specials().eos})
    if (id >= 0) ids.push_back(id);
  return ids;
}

std::string Tokenizer::render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                   const std::string& tools_json) const {
  const SpecialTokens& s = specials();
  CHECK(s.im_system >= 0 && s.im_user >= 0 && s.im_assistant >= 0 && s.im_middle >= 0 && s.im_end >= 0,
        "tokenizer '{}' lacks the chat special tokens", kind());
  const std::string sys = token_bytes(s.im_system), user = token_bytes(s.im_user),
                    asst = token_bytes(s.im_assistant), mid = token_bytes(s.im_middle), end = token_bytes(s.im_end);
  std::string out;
  if (!tools_json.empty()) out += sys + "tool_declare" + mid + tools_json + end;
  for (const auto& m : messages) {
    const std::string& tag = m.role == "user" ? user : m.role == "assistant" ? asst : sys;
    out += tag + (m.name.empty() ? m.role : m.name) + mid;
    if (m.role == "tool" && !m.tool_call_id.empty()) out += "## Return of " + m.tool_call_id + "\n";
    out += m.content + end;
  }
  if (add_generation_prompt) out += asst + "assistant" + mid;
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  if (id < 0 || id >= tok_.vocab_size())
    pending_ += kReplacement;  // it also ends any incomplete character before it
  else if (!(skip_special_ && tok_.is_special(id)))
    pending_ += tok_.token_bytes(id);
  std::string out;
  pending_.erase(0, utf8_decode_replace(pending_, /*final=*/false, &out));
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8_decode_replace(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  std::string cls;
  if (fs::exists(cfg)) {
    std::ifstream f(cfg);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      DS_THROW("{}: not valid JSON ({})", cfg.string(), e.what());
    }
    if (j.contains("tokenizer_class") && j["tokenizer_class"].is_string()) cls = j["tokenizer_class"];
  }
  if (cls == ByteTokenizer::kTokenizerClass) return std::make_unique<ByteTokenizer>();
  // The tiktoken BPE (spec section 7) plugs in here.
  if (fs::exists(fs::path(dir) / "tiktoken.model"))
    DS_THROW("{}: tiktoken tokenizer (tiktoken.model) is not supported by this build yet; only the byte-level "
             "tokenizer (tokenizer_class \"{}\") can be loaded",
             dir, ByteTokenizer::kTokenizerClass);
  DS_THROW("{}: no tokenizer found (expected tokenizer_config.json with tokenizer_class \"{}\", or tiktoken.model)",
           dir, ByteTokenizer::kTokenizerClass);
}

const std::vector<SpecialTokenEntry>& kimi_special_tokens() {
  static const std::vector<SpecialTokenEntry> v = {
      {163584, "[BOS]"},
      {163585, "[EOS]"},
      {163586, "<|im_end|>"},
      {163587, "<|im_user|>"},
      {163588, "<|im_assistant|>"},
      {163590, "<|start_header_id|>"},
      {163591, "<|end_header_id|>"},
      {163593, "[EOT]"},
      {163594, "<|im_system|>"},
      {163595, "<|tool_calls_section_begin|>"},
      {163596, "<|tool_calls_section_end|>"},
      {163597, "<|tool_call_begin|>"},
      {163598, "<|tool_call_argument_begin|>"},
      {163599, "<|tool_call_end|>"},
      {163601, "<|im_middle|>"},
      {163838, "[UNK]"},
      {163839, "[PAD]"},
  };
  return v;
}

void write_byte_level_tiktoken_files(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  {
    const fs::path path = fs::path(dir) / "tiktoken.model";
    std::ofstream f(path);
    for (int b = 0; b < 256; ++b)  // one byte -> two base64 digits + "=="
      f << kB64[b >> 2] << kB64[(b & 3) << 4] << "== " << b << "\n";
    if (!f) DS_THROW("cannot write {}", path.string());
  }
  constexpr int32_t kFirst = 163584, kEnd = 163840;  // 256 special slots after the mergeable ranks
  std::vector<std::string> names(kEnd - kFirst);
  for (int32_t id = kFirst; id < kEnd; ++id) names[id - kFirst] = "<|reserved_token_" + std::to_string(id) + "|>";
  for (const auto& e : kimi_special_tokens()) names[e.id - kFirst] = e.text;
  nlohmann::json added = nlohmann::json::object();
  for (int32_t id = kFirst; id < kEnd; ++id)
    added[std::to_string(id)] = {{"content", names[id - kFirst]}, {"lstrip", false},      {"normalized", false},
                                 {"rstrip", false},               {"single_word", false}, {"special", true}};
  const nlohmann::json j = {
      {"tokenizer_class", "TikTokenTokenizer"},
      {"auto_map", {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}}},
      {"bos_token", "[BOS]"},
      {"eos_token", "[EOS]"},
      {"pad_token", "[PAD]"},
      {"unk_token", "[UNK]"},
      {"model_max_length", 1048576},
      {"added_tokens_decoder", added}};
  const fs::path path = fs::path(dir) / "tokenizer_config.json";
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) DS_THROW("cannot write {}", path.string());
}

}  // namespace ds
