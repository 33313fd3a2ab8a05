// Streaming bytes -> valid UTF-8 text with U+FFFD replacements (see Utf8StreamDecoder in tiktoken.h).
#include "tokenizer/tiktoken_utf8.h"

#include "tokenizer/tiktoken.h"

namespace ds::tok {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends the complete part of text to out; returns the length of an incomplete tail left unconsumed.
size_t append_complete(std::string_view text, std::string& out) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t ascii = pos;
    while (ascii < text.size() && static_cast<unsigned char>(text[ascii]) < 0x80) ++ascii;
    out.append(text.data() + pos, ascii - pos);
    pos = ascii;
    if (pos == text.size()) break;
    Utf8Char ch = utf8_next(text, pos);
    if (ch.valid)
      out.append(text.data() + pos, ch.len);
    else if (ch.truncated)
      return text.size() - pos;
    else
      out += kReplacement;
    pos += ch.len;
  }
  return 0;
}

}  // namespace

void Utf8StreamDecoder::push(std::string_view bytes, std::string& out) {
  if (pending_.empty()) {
    size_t tail = append_complete(bytes, out);
    pending_.assign(bytes.substr(bytes.size() - tail));
    return;
  }
  std::string joined = pending_ + std::string(bytes);
  size_t tail = append_complete(joined, out);
  pending_ = joined.substr(joined.size() - tail);
}

void Utf8StreamDecoder::finish(std::string& out) {
  if (!pending_.empty()) out += kReplacement;  // an incomplete char is one maximal subpart
  pending_.clear();
}

std::string utf8_replace_invalid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8StreamDecoder d;
  d.push(bytes, out);
  d.finish(out);
  return out;
}

}  // namespace ds::tok
