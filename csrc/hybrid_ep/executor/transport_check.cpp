#include <stdexcept>
#include <string>

#include "hybrid_ep/executor/executor.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {

unsigned long long run_transport_check(Runtime& runtime, size_t bytes, int channel,
                                       cudaStream_t stream) {
  const BufferLayout& l = runtime.layout();
  const BufferShape& s = runtime.shape();
  const TransportContext& t = runtime.transport();
  // Slots 0..N of `bytes` each in the combine rows region, idle between operations.
  const size_t room = l.combine_probs - l.combine_rows;
  if (bytes == 0 || bytes * size_t(t.nodes + 1) > room) {
    throw std::invalid_argument("transport check: bytes=" + std::to_string(bytes) +
                                ": expected 1.." + std::to_string(room / (t.nodes + 1)));
  }
  if (channel < 0 || channel >= t.channels) {
    throw std::invalid_argument("transport check: channel=" + std::to_string(channel) +
                                ": expected 0.." + std::to_string(t.channels - 1));
  }
  unsigned long long* mismatches = nullptr;
  HYBRID_EP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&mismatches), sizeof(*mismatches)));
  unsigned long long result = 0;
  try {
    HYBRID_EP_CUDA_CHECK(cudaMemsetAsync(mismatches, 0, sizeof(*mismatches), stream));
    TransportCheckParams p{};
    p.domain = runtime.domain();
    p.transport = t;
    p.scratch = l.combine_rows;
    p.network_flags = l.network_flags;
    p.max_chunks = int(s.max_chunks());
    p.channel = channel;
    p.bytes = bytes;
    p.mismatches = mismatches;
    launch_transport_check(p, stream);
    HYBRID_EP_CUDA_CHECK(
        cudaMemcpyAsync(&result, mismatches, sizeof(result), cudaMemcpyDeviceToHost, stream));
    HYBRID_EP_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaFree(mismatches);
    throw;
  }
  HYBRID_EP_CUDA_CHECK(cudaFree(mismatches));
  return result;
}

}  // namespace hybrid_ep
