// BPE core of the tiktoken tokenizer: the bytes -> rank table and the rank-ordered pair merge of one piece.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds::tok {

// Open-addressing hash table from token bytes to rank, over one byte arena (163,584 Kimi tokens: ~2 MB of
// bytes, 8 MB of slots). Immutable after construction, so lookups from many threads need no lock.
class RankTable {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // tokens[rank] = the token's bytes; an empty string marks an unused rank (tiktoken allows gaps).
  explicit RankTable(const std::vector<std::string>& tokens);

  uint32_t find(std::string_view bytes) const;
  uint32_t find(const char* p, size_t n) const { return find(std::string_view(p, n)); }
  // Bytes of rank r (empty for an unused rank or r out of range).
  std::string_view bytes(uint32_t rank) const;
  size_t size() const { return offsets_.size() - 1; }  // number of rank slots, unused ones included

 private:
  std::string arena_;              // all token bytes, back to back
  std::vector<uint32_t> offsets_;  // [ranks + 1]: token r is arena_[offsets_[r], offsets_[r + 1])
  struct Slot {
    uint32_t rank;  // kNone = empty
    uint32_t tag;   // high half of the key's hash
  };
  std::vector<Slot> slots_;  // power-of-two open-addressing table
  uint64_t mask_ = 0;
};

// Appends the ranks of one pre-tokenized piece to out, with tiktoken's semantics: a piece that is itself a
// token is that token; otherwise adjacent parts are merged, lowest rank of the concatenation first
// (leftmost on ties), until no adjacent pair is a token. Every single byte must be a token.
void bpe_encode_piece(const RankTable& table, std::string_view piece, std::vector<int32_t>& out);

namespace detail {
// The two merge strategies bpe_encode_piece chooses between (exposed so tests can cross-check them):
// tiktoken's O(n^2) scan over a part list, fastest for short pieces, and an O(n log n) heap over a linked
// list for long ones (a 25,000-byte run would take ~10^9 steps with the scan).
void bpe_merge_scan(const RankTable& table, std::string_view piece, std::vector<int32_t>& out);
void bpe_merge_heap(const RankTable& table, std::string_view piece, std::vector<int32_t>& out);
}  // namespace detail

}  // namespace ds::tok
