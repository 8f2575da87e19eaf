#include "transport_backend.h"

#include <cuda_runtime_api.h>

#include <stdexcept>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/transport/transport.h"

namespace hybrid_ep {

TransportHost::TransportHost(const TransportSetup& setup)
    : registered_(setup.registered),
      nodes_(setup.nodes),
      node_rank_(setup.node_rank),
      channels_(setup.channels) {
  setup.check();
  wire_ = wire_model_from_options(setup.options);
  if (const auto peers = setup.options.find("peers"); peers != setup.options.end()) {
    if (peers->second != "unmapped") {
      throw std::invalid_argument("p2p transport: option peers='" + peers->second +
                                  "', expected 'unmapped'");
    }
    unmapped_ = true;
  }
  counters_ = allocate_counters(channels_);
  try {
    allocate_wire_state(wire_);
  } catch (...) {
    cudaFree(counters_);
    throw;
  }
}

TransportHost::~TransportHost() {
  disconnect();
  if (counters_ != nullptr) cudaFree(counters_);
  free_wire_state(wire_);
}

std::string TransportHost::bootstrap() const { return registered_->export_handle(); }

void TransportHost::connect(const std::vector<std::string>& blobs) {
  if (int(blobs.size()) != nodes_) {
    throw std::invalid_argument("transport connect: expected " + std::to_string(nodes_) +
                                " bootstrap blobs (one per domain), got " +
                                std::to_string(blobs.size()));
  }
  disconnect();
  mappings_.assign(nodes_, PeerMapping{});
  std::vector<uint8_t*> bases(nodes_, nullptr);
  for (int n = 0; n < nodes_; ++n) {
    if (n == node_rank_) {
      bases[n] = registered_->local();
      continue;
    }
    mappings_[n] = map_peer(registered_->kind(), blobs[n], registered_->bytes(),
                            "the peer in domain " + std::to_string(n));
    bases[n] = mappings_[n].address;
  }
  HYBRID_EP_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&node_bases_), sizeof(uint8_t*) * bases.size()));
  HYBRID_EP_CUDA_CHECK(cudaMemcpy(node_bases_, bases.data(), sizeof(uint8_t*) * bases.size(),
                                  cudaMemcpyHostToDevice));
  connected_ = true;
}

void TransportHost::disconnect() noexcept {
  for (const PeerMapping& mapping : mappings_) {
    unmap_peer(registered_->kind(), mapping, registered_->bytes());
  }
  mappings_.clear();
  if (node_bases_ != nullptr) cudaFree(node_bases_);
  node_bases_ = nullptr;
  connected_ = false;
}

TransportContext TransportHost::context() const {
  if (!connected_) throw std::logic_error("transport: connect() first");
  return TransportContext{node_bases_, counters_, nodes_, node_rank_, channels_, wire_, unmapped_};
}

std::vector<ChannelCounters> TransportHost::counters() const {
  return read_counters(counters_, channels_);
}

void TransportHost::reset_counters() { zero_counters(counters_, channels_); }

}  // namespace hybrid_ep
