// Constants shared by the kernels (host and device code alike).
#pragma once

namespace ds {

// log2(e): e^x = 2^(x log2(e)), the form the MUFU ex2 instruction computes (the softmaxes of the attention
// kernels and the KDA gates scale by it once and then use ex2 only).
inline constexpr float kLog2e = 1.44269504088896341f;

}  // namespace ds
