// DEP dispatch planning (see dep_dispatch.h).
#include "runtime/dep_dispatch.h"

#include <cstring>

#include "core/error.h"

namespace ds::dep {

namespace {

template <class T> void put(std::string& s, const T* p, size_t n) {
  s.append(reinterpret_cast<const char*>(p), n * sizeof(T));
}

}  // namespace

Dispatch plan_dispatch(const int32_t* ids, const float* weights, int T, int K, int W, int EL) {
  CHECK(W >= 1 && W <= 64 && EL >= 1 && K >= 1 && T >= 0, "DEP dispatch: W = {}, EL = {}, K = {}, T = {}", W, EL, K, T);
  Dispatch d;
  d.to.assign(W, {});
  for (int t = 0; t < T; ++t) {
    uint64_t mask = 0;
    for (int k = 0; k < K; ++k) {
      const int e = ids[static_cast<size_t>(t) * K + k];
      CHECK(e >= 0 && e < W * EL, "DEP dispatch: token {} routes to expert {} outside [0, {})", t, e, W * EL);
      mask |= uint64_t{1} << (e / EL);
    }
    for (int p = 0; p < W; ++p)
      if (mask >> p & 1) d.to[p].push_back(t);
  }
  d.send_rows.resize(W);
  d.send_off.resize(W);
  std::vector<int32_t> first(W);
  for (int p = 0; p < W; ++p) {
    d.send_off[p] = d.send_idx.size();
    d.send_rows[p] = d.to[p].size();
    d.send_idx.insert(d.send_idx.end(), d.to[p].begin(), d.to[p].end());
    const uint32_t n = static_cast<uint32_t>(d.to[p].size());
    put(d.message, &n, 1);
    for (int32_t t : d.to[p]) put(d.message, ids + static_cast<size_t>(t) * K, K);
    for (int32_t t : d.to[p]) put(d.message, weights + static_cast<size_t>(t) * K, K);
  }
  d.comb_idx.assign(static_cast<size_t>(T) * W, -1);
  std::vector<size_t> pos(W, 0);
  for (int t = 0; t < T; ++t)
    for (int p = 0; p < W; ++p)
      if (pos[p] < d.to[p].size() && d.to[p][pos[p]] == t)
        d.comb_idx[static_cast<size_t>(t) * W + p] = static_cast<int32_t>(d.send_off[p] + pos[p]++);
  return d;
}

Received parse_received(const std::vector<std::string>& all, int me, int W, int K) {
  CHECK(static_cast<int>(all.size()) == W && me >= 0 && me < W, "DEP receive: {} messages for rank {} of {}",
        all.size(), me, W);
  Received r;
  r.rows.resize(W);
  r.off.resize(W);
  const size_t row_bytes = static_cast<size_t>(K) * 8;
  for (int src = 0; src < W; ++src) {
    const std::string& m = all[src];
    size_t at = 0;
    for (int p = 0; p < W; ++p) {
      uint32_t n = 0;
      CHECK(at + 4 <= m.size(), "DEP receive: rank {}'s message is truncated", src);
      std::memcpy(&n, m.data() + at, 4);
      at += 4;
      CHECK(at + n * row_bytes <= m.size(), "DEP receive: rank {}'s message is truncated", src);
      if (p == me) {
        r.rows[src] = n;
        r.off[src] = r.total;
        r.total += n;
        const size_t old = r.ids.size();
        r.ids.resize(old + static_cast<size_t>(n) * K);
        r.weights.resize(old + static_cast<size_t>(n) * K);
        if (n > 0) {  // memcpy with an empty vector's null data() is undefined, even of 0 bytes
          std::memcpy(r.ids.data() + old, m.data() + at, static_cast<size_t>(n) * K * 4);
          std::memcpy(r.weights.data() + old, m.data() + at + static_cast<size_t>(n) * K * 4,
                      static_cast<size_t>(n) * K * 4);
        }
      }
      at += n * row_bytes;
    }
    CHECK(at == m.size(), "DEP receive: rank {}'s message has {} bytes, expected {}", src, m.size(), at);
  }
  return r;
}

}  // namespace ds::dep
