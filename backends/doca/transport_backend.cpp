#include "transport_backend.h"

#include <cuda_runtime_api.h>

#include <stdexcept>

#include "doca_library.h"
#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/transport/device_state.h"
#include "hybrid_ep/transport/transport.h"
#include "network.h"
#include "options.h"

namespace hybrid_ep {
namespace {

// Warps of one launch that can batch their puts (a slot each, by block and warp index); warps
// past this post each put at once, which is slower but correct. 4096 slots are 3 MiB.
constexpr int kBatchSlots = 4096;
constexpr size_t kSinkBytes = 256;

}  // namespace

std::string TransportHost::preflight() { return "doca: " + doca::library().description; }

TransportHost::TransportHost(const TransportSetup& setup)
    : registered_(setup.registered),
      nodes_(setup.nodes),
      node_rank_(setup.node_rank),
      channels_(setup.channels),
      timeout_ns_(setup.timeout_ns) {
  setup.check();
  // Libraries and options first: what is missing must fail before any GPU allocation.
  doca::Options options;
  if (nodes_ > 1) {
    doca::library();
    options = doca::parse_options(setup.options);
  }
  try {
    counters_ = allocate_counters(channels_);
    fault_ = device_zeros<unsigned int>(1);
    if (nodes_ > 1) {
      batch_slots_ = kBatchSlots;
      batches_ = device_zeros<DocaBatch>(size_t(batch_slots_));
      sink_ = device_zeros<uint64_t>(kSinkBytes / sizeof(uint64_t));
      network_ = std::make_unique<doca::Network>(options, nodes_, node_rank_, channels_,
                                                 registered_->local(), registered_->bytes(), sink_,
                                                 kSinkBytes);
    }
  } catch (...) {
    cudaFree(counters_);
    cudaFree(fault_);
    cudaFree(batches_);
    cudaFree(sink_);
    throw;
  }
}

TransportHost::~TransportHost() {
  network_.reset();  // queue pairs and registrations go before the memory they point at
  cudaFree(routes_);
  cudaFree(counters_);
  cudaFree(fault_);
  cudaFree(batches_);
  cudaFree(sink_);
}

std::string TransportHost::bootstrap() const { return network_ ? network_->blob() : ""; }

void TransportHost::connect(const std::vector<std::string>& blobs) {
  if (int(blobs.size()) != nodes_) {
    throw std::invalid_argument("transport connect: expected " + std::to_string(nodes_) +
                                " bootstrap blobs (one per domain), got " +
                                std::to_string(blobs.size()));
  }
  if (connected_) throw std::logic_error("doca transport: connect() twice");
  std::vector<DocaRoute> routes(size_t(channels_) * nodes_, DocaRoute{});
  if (network_) routes = network_->connect(blobs);
  HYBRID_EP_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&routes_), sizeof(DocaRoute) * routes.size()));
  HYBRID_EP_CUDA_CHECK(cudaMemcpy(routes_, routes.data(), sizeof(DocaRoute) * routes.size(),
                                  cudaMemcpyHostToDevice));
  connected_ = true;
}

TransportContext TransportHost::context() const {
  if (!connected_) throw std::logic_error("transport: connect() first");
  return TransportContext{routes_,
                          registered_->local(),
                          registered_->bytes(),
                          sink_,
                          batches_,
                          batch_slots_,
                          counters_,
                          fault_,
                          nodes_,
                          node_rank_,
                          channels_,
                          timeout_ns_};
}

// Also the place where device-side faults surface: the GPU cannot throw, so it leaves bits in
// the fault word and the next synchronous read reports them.
std::vector<ChannelCounters> TransportHost::counters() const {
  std::vector<ChannelCounters> out = read_counters(counters_, channels_);
  const unsigned int fault = read_fault_bits(fault_);
  if (fault & kDocaFaultSourceOutside) {
    throw std::runtime_error(
        "doca transport: a put's source was outside this rank's registered buffer; RDMA sends "
        "only from registered memory, so the kernel must stage its data there first");
  }
  if (fault & kDocaFaultCompletion) {
    throw std::runtime_error("doca transport: a work request completed with an error (" +
                             (network_ ? network_->queue_errors() : std::string()) + ")");
  }
  if (fault & kDocaFaultFlushTimeout) {
    throw std::runtime_error(
        "doca transport: a flush waited a minute for completions that did "
        "not come (peer gone or link down?)");
  }
  return out;
}

void TransportHost::reset_counters() { zero_counters(counters_, channels_); }

}  // namespace hybrid_ep
