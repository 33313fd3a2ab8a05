// KDA decode compact-heads instantiations, H = 16..128 (see kda_decode_compact_small.cu for the rest).
#include "kernels/kda/kda_decode_kernel.cuh"

namespace ds::kda {

template void launch_kda_decode_compact<16>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<24>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<32>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<48>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<64>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<96>(const KdaDecodeParams&, cudaStream_t);
template void launch_kda_decode_compact<128>(const KdaDecodeParams&, cudaStream_t);

}  // namespace ds::kda
