// KDA decode compact-heads instantiations, H = 1..12 (8 one-warp CTAs per head, one cluster). The other
// half of DS_KDA_COMPACT_HEADS is in kda_decode_compact_large.cu so the two compile in parallel; a count
// in the list but in neither file fails at link time, one in a file but not in the list at compile time.
#include "kernels/kda/kda_decode_kernel.cuh"

namespace ds::kda {

template void launch_kda_decode_compact<1>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<2>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<3>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<4>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<6>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<8>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<12>(const KdaDecodeParams&, cudaStream_t);

}  // namespace ds::kda
