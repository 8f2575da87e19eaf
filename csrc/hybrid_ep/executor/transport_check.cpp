#include <stdexcept>
#include <string>
#include <vector>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/executor/executor.h"

namespace hybrid_ep {

unsigned long long run_transport_check(Runtime& runtime, size_t bytes, int channel,
                                       cudaStream_t stream, std::vector<uint64_t>* times) {
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
  // One allocation: the mismatch count, then the 2N times when asked for.
  const size_t words = 1 + (times != nullptr ? 2 * size_t(t.nodes) : 0);
  unsigned long long* mismatches = nullptr;
  HYBRID_EP_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&mismatches), sizeof(*mismatches) * words));
  unsigned long long result = 0;
  try {
    HYBRID_EP_CUDA_CHECK(cudaMemsetAsync(mismatches, 0, sizeof(*mismatches) * words, stream));
    TransportCheckParams p{};
    p.domain = runtime.domain();
    p.transport = t;
    p.scratch = l.combine_rows;
    p.network_flags = l.flag_tables(s).network;
    p.channel = channel;
    p.bytes = bytes;
    p.mismatches = mismatches;
    p.times = times != nullptr ? mismatches + 1 : nullptr;
    launch_transport_check(p, stream);
    std::vector<unsigned long long> out(words);
    HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(out.data(), mismatches, sizeof(*mismatches) * words,
                                         cudaMemcpyDeviceToHost, stream));
    HYBRID_EP_CUDA_CHECK(cudaStreamSynchronize(stream));
    result = out[0];
    if (times != nullptr) times->assign(out.begin() + 1, out.end());
  } catch (...) {
    cudaFree(mismatches);
    throw;
  }
  HYBRID_EP_CUDA_CHECK(cudaFree(mismatches));
  return result;
}

void run_network_send_check(Runtime& runtime, const bool* goes, const uint8_t* rows, int num_tokens,
                            int row_bytes, int blocks, cudaStream_t stream) {
  const RuntimeConfig& c = runtime.config();
  const BufferLayout& l = runtime.layout();
  const BufferShape& s = runtime.shape();
  // Like dispatch, every chunk of the buffer's T tokens is sent and signalled: the maps are
  // [T, ...] (rows past a rank's own tokens are simply not selected).
  if (num_tokens != c.max_tokens || row_bytes <= 0 || row_bytes > s.max_row_bytes ||
      row_bytes % 16 != 0) {
    throw std::invalid_argument(
        "network send check: num_tokens=" + std::to_string(num_tokens) +
        ", row_bytes=" + std::to_string(row_bytes) + ": expected " + std::to_string(c.max_tokens) +
        " (the buffer's tokens) and a multiple of 16 up to " + std::to_string(s.max_row_bytes));
  }
  // The check sends every chunk at once, with no credits: each needs its own ring slot.
  if (s.net_ring_chunks < s.max_chunks()) {
    throw std::invalid_argument(
        "network send check: the rings hold " + std::to_string(s.net_ring_chunks) +
        " chunks per domain: expected "
        "all " +
        std::to_string(s.max_chunks()) + " (HYBRID_EP_NET_RING_CHUNKS unset or larger)");
  }
  NetworkSendCheckParams p{};
  p.domain = runtime.domain();
  p.transport = runtime.transport();
  p.goes = goes;
  // Puts read what dispatch's network leg reads: the rows staged where the backend needs them.
  size_t staged = 0;
  p.rows = static_cast<const uint8_t*>(
      network_source(runtime, rows, size_t(num_tokens) * row_bytes, l.staged_rows, stream, staged));
  p.num_tokens = num_tokens;
  p.chunk = c.dispatch_chunk;
  p.row_bytes = row_bytes;
  p.net_rows = l.net_rows;
  p.ring_chunks = int(s.net_ring_chunks);
  p.network_flags = l.flag_tables(s).network;
  launch_network_send_check(p, blocks, stream);
  HYBRID_EP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace hybrid_ep
