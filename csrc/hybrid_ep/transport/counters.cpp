#include "hybrid_ep/transport/counters.h"

#include <cuda_runtime_api.h>

#include "hybrid_ep/common/cuda_check.h"

namespace hybrid_ep {

ChannelCounters* allocate_counters(int channels) {
  ChannelCounters* device = nullptr;
  HYBRID_EP_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&device), sizeof(ChannelCounters) * size_t(channels)));
  zero_counters(device, channels);
  return device;
}

std::vector<ChannelCounters> read_counters(const ChannelCounters* device, int channels) {
  std::vector<ChannelCounters> out(channels);
  HYBRID_EP_CUDA_CHECK(
      cudaMemcpy(out.data(), device, sizeof(ChannelCounters) * out.size(), cudaMemcpyDeviceToHost));
  return out;
}

void zero_counters(ChannelCounters* device, int channels) {
  HYBRID_EP_CUDA_CHECK(cudaMemset(device, 0, sizeof(ChannelCounters) * size_t(channels)));
}

}  // namespace hybrid_ep
