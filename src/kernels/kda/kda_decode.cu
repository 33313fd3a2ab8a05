// KDA decode: the many-heads instantiation and the op's single dispatch point (layout + head count ->
// template arguments).
#include "kernels/kda/kda_decode_kernel.cuh"

namespace ds::kda {

void kda_decode_stream_launch(const KdaDecodeParams& p, cudaStream_t stream);  // kda_decode_stream.cu

void kda_decode_launch(const KdaDecodeParams& p, KdaLayout layout, Stream stream) {
  if (layout == KdaLayout::kStream) return kda_decode_stream_launch(p, stream);
  if (layout != KdaLayout::kCompact) return launch_kda_decode<1, 0>(p, stream);
  switch (p.H) {
#define DS_KDA_CASE(H) \
  case H:              \
    return launch_kda_decode_compact<H>(p, stream);
    DS_KDA_COMPACT_HEADS(DS_KDA_CASE)
#undef DS_KDA_CASE
    default:
      detail::throw_no_compact_instantiation(p.H);
  }
}

}  // namespace ds::kda
