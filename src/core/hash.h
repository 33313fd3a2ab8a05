// Small deterministic hashes shared by everything that derives seeds (random weights on the CPU and the GPU,
// request seeds): one definition, so the same seed and name give the same stream everywhere.
#pragma once

#include <cstdint>
#include <string_view>

namespace ds {

// splitmix64 (Steele, Lea, Flood 2014): a well-mixed 64-bit value from any 64-bit input.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a 64-bit of a string (tensor names -> per-tensor seeds).
constexpr uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

}  // namespace ds
