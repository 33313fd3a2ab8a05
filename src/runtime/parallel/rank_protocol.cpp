// Binary encoding of the driver/worker messages (rank_protocol.h): little-endian fixed-width fields, length-
// prefixed strings and arrays, one tag byte and one version byte in front.
#include "runtime/parallel/rank_protocol.h"

#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace ds::parallel {
namespace {

constexpr uint8_t kVersion = 1;
constexpr uint8_t kTagFrame = 'F';
constexpr uint8_t kTagReport = 'R';

// Every field of Request and SamplingParams is written below; a new field must be added there (and here).
static_assert(sizeof(SamplingParams) == 64 && sizeof(Request) == 88,
              "Request or SamplingParams changed: serialize the new field in rank_protocol.cpp, then update this "
              "size check");

class Writer {
 public:
  template <class T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    out_ += s;
  }
  void ids(const std::vector<int32_t>& v) {
    pod<uint64_t>(v.size());
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const std::string& s, int from, const char* what) : s_(s), from_(from), what_(what) {}
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint64_t count(size_t elem_bytes) {
    const uint64_t n = pod<uint64_t>();
    if (elem_bytes > 0 && n > (s_.size() - pos_) / elem_bytes) fail("a count runs past the end");
    return n;
  }
  std::string str() {
    const uint64_t n = count(1);
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::vector<int32_t> ids() {
    const uint64_t n = count(sizeof(int32_t));
    std::vector<int32_t> v(n);
    if (n > 0) std::memcpy(v.data(), s_.data() + pos_, n * sizeof(int32_t));  // an empty vector's data() is null
    pos_ += n * sizeof(int32_t);
    return v;
  }
  void header(uint8_t tag) {
    const auto t = pod<uint8_t>();
    const auto v = pod<uint8_t>();
    if (t != tag) fail(fmt::format("tag {} instead of {}", int(t), int(tag)));
    if (v != kVersion) fail(fmt::format("version {} instead of {} (ranks run different builds?)", int(v), kVersion));
  }
  void end() {
    if (pos_ != s_.size()) fail(fmt::format("{} trailing bytes", s_.size() - pos_));
  }
  [[noreturn]] void fail(const std::string& why) {
    DS_THROW("malformed {} from rank {} ({} bytes): {}", what_, from_, s_.size(), why);
  }

 private:
  void need(size_t n) {
    if (s_.size() - pos_ < n) fail("truncated");
  }
  const std::string& s_;
  size_t pos_ = 0;
  int from_;
  const char* what_;
};

void put_request(Writer& w, const Request& r) {
  w.ids(r.prompt);
  const SamplingParams& p = r.sampling;
  w.pod<int32_t>(p.max_tokens);
  w.pod<float>(p.temperature);
  w.pod<int32_t>(p.top_k);
  w.pod<float>(p.top_p);
  w.pod<uint8_t>(p.seed.has_value());
  w.pod<uint64_t>(p.seed.value_or(0));
  w.ids(p.stop_token_ids);
  w.pod<uint8_t>(p.ignore_eos);
}

Request get_request(Reader& r) {
  Request q;
  q.prompt = r.ids();
  SamplingParams& p = q.sampling;
  p.max_tokens = r.pod<int32_t>();
  p.temperature = r.pod<float>();
  p.top_k = r.pod<int32_t>();
  p.top_p = r.pod<float>();
  const bool has_seed = r.pod<uint8_t>() != 0;
  const uint64_t seed = r.pod<uint64_t>();
  if (has_seed) p.seed = seed;
  p.stop_token_ids = r.ids();
  p.ignore_eos = r.pod<uint8_t>() != 0;
  return q;
}

void put_stats(Writer& w, const EngineStats& s) {
  for (int v : {s.running, s.waiting, s.slots_in_use, s.free_slots, s.max_seqs}) w.pod<int32_t>(v);
  for (int64_t v : {s.steps, s.prompt_tokens, s.generated_tokens}) w.pod<int64_t>(v);
}

EngineStats get_stats(Reader& r) {
  EngineStats s;
  for (int* v : {&s.running, &s.waiting, &s.slots_in_use, &s.free_slots, &s.max_seqs}) *v = r.pod<int32_t>();
  for (int64_t* v : {&s.steps, &s.prompt_tokens, &s.generated_tokens}) *v = r.pod<int64_t>();
  return s;
}

}  // namespace

std::string encode(const Frame& f) {
  Writer w;
  w.pod<uint8_t>(kTagFrame);
  w.pod<uint8_t>(kVersion);
  w.pod<uint8_t>(static_cast<uint8_t>(f.kind));
  w.pod<uint64_t>(f.adds.size());
  for (const auto& a : f.adds) {
    w.pod<int32_t>(a.rank);
    w.pod<uint64_t>(a.id);
    put_request(w, a.request);
  }
  w.pod<uint64_t>(f.cancels.size());
  for (const auto& c : f.cancels) {
    w.pod<int32_t>(c.rank);
    w.pod<uint64_t>(c.id);
  }
  w.str(f.message);
  return w.take();
}

Frame decode_frame(const std::string& bytes, int from) {
  Reader r(bytes, from, "control frame");
  r.header(kTagFrame);
  Frame f;
  const auto kind = r.pod<uint8_t>();
  if (kind < 1 || kind > 4) r.fail(fmt::format("unknown frame kind {}", int(kind)));
  f.kind = static_cast<FrameKind>(kind);
  const uint64_t na = r.count(4 + 8 + 8);  // at least rank, id and the prompt's length per add
  for (uint64_t i = 0; i < na; ++i) {
    AddCommand a;
    a.rank = r.pod<int32_t>();
    a.id = r.pod<uint64_t>();
    a.request = get_request(r);
    f.adds.push_back(std::move(a));
  }
  const uint64_t nc = r.count(4 + 8);
  for (uint64_t i = 0; i < nc; ++i) {
    CancelCommand c;
    c.rank = r.pod<int32_t>();
    c.id = r.pod<uint64_t>();
    f.cancels.push_back(c);
  }
  f.message = r.str();
  r.end();
  return f;
}

std::string encode(const Report& rep) {
  Writer w;
  w.pod<uint8_t>(kTagReport);
  w.pod<uint8_t>(kVersion);
  w.str(rep.error);
  w.pod<uint8_t>(rep.has_work);
  w.pod<uint64_t>(rep.outputs.size());
  for (const auto& o : rep.outputs) {
    w.pod<uint64_t>(o.id);
    w.ids(o.new_tokens);
    w.pod<uint8_t>(o.finished);
    w.pod<uint8_t>(static_cast<uint8_t>(o.reason));
    w.pod<int32_t>(o.prompt_tokens);
    w.pod<int32_t>(o.generated_tokens);
  }
  w.pod<uint64_t>(rep.refused.size());
  for (const auto& x : rep.refused) {
    w.pod<uint64_t>(x.id);
    w.str(x.message);
  }
  put_stats(w, rep.stats);
  return w.take();
}

Report decode_report(const std::string& bytes, int from) {
  Reader r(bytes, from, "rank report");
  r.header(kTagReport);
  Report rep;
  rep.error = r.str();
  rep.has_work = r.pod<uint8_t>() != 0;
  const uint64_t no = r.count(8 + 8 + 1 + 1 + 4 + 4);
  for (uint64_t i = 0; i < no; ++i) {
    RequestOutput o;
    o.id = r.pod<uint64_t>();
    o.new_tokens = r.ids();
    o.finished = r.pod<uint8_t>() != 0;
    const auto reason = r.pod<uint8_t>();
    if (reason > static_cast<uint8_t>(FinishReason::kCancelled)) r.fail(fmt::format("finish reason {}", int(reason)));
    o.reason = static_cast<FinishReason>(reason);
    o.prompt_tokens = r.pod<int32_t>();
    o.generated_tokens = r.pod<int32_t>();
    rep.outputs.push_back(std::move(o));
  }
  const uint64_t nr = r.count(8 + 8);
  for (uint64_t i = 0; i < nr; ++i) {
    Refusal x;
    x.id = r.pod<uint64_t>();
    x.message = r.str();
    rep.refused.push_back(std::move(x));
  }
  rep.stats = get_stats(r);
  r.end();
  return rep;
}

std::string first_rank_error(const std::vector<std::string>& msgs, int first) {
  for (int r = first; r < static_cast<int>(msgs.size()); ++r) {
    const Report rep = decode_report(msgs[r], r);
    if (!rep.error.empty()) return fmt::format("rank {} failed: {}", r, rep.error);
  }
  return "";
}

}  // namespace ds::parallel
