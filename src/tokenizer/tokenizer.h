// Tokenizer interface (byte-level tokenizer now, tiktoken BPE later), UTF-8 streaming decoder, Kimi chat format.
//
// Contract every implementation keeps:
//   - encode(text) matches special-token strings in the text as specials (HF's allowed_special="all"), and
//     encodes everything else as ordinary tokens; no BOS is prepended (spec section 7).
//   - token_bytes(id) is the raw byte string of a token; for a special token it is its text ("<|im_end|>").
//   - decode / StreamDecoder concatenate token bytes, then read them as UTF-8, replacing every maximal invalid
//     subpart with U+FFFD (Python's errors="replace"), so decode(ids) == concatenation of the streamed pieces
//     + flush(). skip_special drops special tokens before the bytes are joined (HF skip_special_tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

// Ids of the special tokens the engine and the chat format use; -1 where the tokenizer has none.
struct SpecialTokens {
  int32_t bos = -1;           // [BOS]
  int32_t eos = -1;           // [EOS]
  int32_t im_end = -1;        // <|im_end|>  (the model's end of turn: config eos for Kimi-Linear)
  int32_t im_user = -1;       // <|im_user|>
  int32_t im_assistant = -1;  // <|im_assistant|>
  int32_t im_system = -1;     // <|im_system|>
  int32_t im_middle = -1;     // <|im_middle|>
  int32_t pad = -1;           // [PAD]
};

struct ChatMessage {
  std::string role;          // system | user | assistant | tool | any other role
  std::string content;
  std::string name;          // optional: replaces the role in the role tag
  std::string tool_call_id;  // role "tool": rendered as "## Return of {id}\n{content}"
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::string kind() const = 0;  // "byte", "tiktoken"
  virtual int vocab_size() const = 0;    // every id < vocab_size is valid
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Raw bytes of one token; throws ds::Error for an id outside [0, vocab_size).
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual std::optional<int32_t> special_token_id(std::string_view text) const = 0;
  virtual const SpecialTokens& specials() const = 0;

  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Ids that end an assistant turn: <|im_end|> and [EOS] (those the tokenizer has).
  std::vector<int32_t> stop_token_ids() const;
  // The Kimi chat format (spec section 7) as text; special tags appear as their strings, so
  // encode(render_chat(...)) yields them as single special tokens. tools_json, when not empty, is emitted as the
  // tool_declare system turn first. No default system prompt is injected (the Kimi-Linear template has none).
  std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& tools_json = "") const;
  std::vector<int32_t> encode_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                   const std::string& tools_json = "") const {
    return encode(render_chat(messages, add_generation_prompt, tools_json));
  }
};

// Incremental detokeniser for streaming: push() returns only complete UTF-8 characters; bytes of a character that
// is still incomplete wait for the next token. flush() ends the stream (an incomplete tail becomes U+FFFD).
// An id the tokenizer has no text for (outside [0, vocab_size): a model vocabulary padded past the tokenizer's,
// or random weights served with the byte tokenizer) becomes U+FFFD instead of an exception in the server.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false) : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();
  bool has_pending() const { return !pending_.empty(); }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

// Appends the UTF-8 text of `bytes` to *out, each maximal invalid subpart replaced by U+FFFD (EF BF BD), and
// returns the number of bytes consumed. When !final, a trailing sequence that could still become a valid character
// is left unconsumed.
size_t utf8_decode_replace(std::string_view bytes, bool final, std::string* out);

// Loads the tokenizer of a model directory: tokenizer_config.json with "tokenizer_class": "deltaserve-byte" gives
// the ByteTokenizer. A tiktoken.model tokenizer is refused with a clear error until the tiktoken loader lands.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

// The Kimi-Linear special tokens (spec section 7) with their real ids, for writing tokenizer files.
struct SpecialTokenEntry {
  int32_t id;
  const char* text;
};
const std::vector<SpecialTokenEntry>& kimi_special_tokens();

// Writes a minimal Kimi-format tokenizer into dir: tiktoken.model with the 256 single-byte tokens (base64 of the
// byte, rank = byte value: a valid BPE with no merges) and tokenizer_config.json with the Kimi special tokens at
// their real ids (163584..163839; unnamed ones as <|reserved_token_{id}|>). For random-weight checkpoints of the
// real shape; real checkpoints ship their own files.
void write_byte_level_tiktoken_files(const std::string& dir);

}  // namespace ds
