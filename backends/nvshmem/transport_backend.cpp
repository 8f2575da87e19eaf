#include "transport_backend.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/transport/device_state.h"
#include "hybrid_ep/transport/transport.h"
#include "session.h"
#include "status.h"

namespace hybrid_ep {
namespace {

std::string from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) {
    throw std::invalid_argument("nvshmem transport: option unique_id is not hex");
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = char(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

}  // namespace

std::string TransportHost::preflight() { return nvshmem::preflight(); }

std::string TransportHost::unique_id() { return nvshmem::make_unique_id(); }

std::string TransportHost::describe_failure(const std::string& call, int status, int stage) {
  return nvshmem::describe_failure(call, status, stage);
}

std::string TransportHost::version_mismatch(int built_major, int built_minor, int built_patch,
                                            int loaded_major, int loaded_minor, int loaded_patch) {
  return nvshmem::version_mismatch(built_major, built_minor, built_patch, loaded_major,
                                   loaded_minor, loaded_patch);
}

std::unique_ptr<SymmetricBuffer> TransportHost::make_registered(const TransportSetup& setup,
                                                                size_t bytes, HandleKind kind) {
  setup.check();
  if (setup.nodes == 1) return std::make_unique<SymmetricBuffer>(bytes, kind);
  const auto id = setup.options.find("unique_id");
  if (id == setup.options.end()) {
    throw std::invalid_argument(
        "nvshmem transport: no unique_id option; the Python layer "
        "(hybrid_ep/transport_bootstrap.py) must pass rank 0's unique id to every rank");
  }
  const int rank = setup.node_rank * setup.ranks + setup.local_rank;
  std::shared_ptr<nvshmem::Session> session =
      nvshmem::Session::join(rank, setup.nodes * setup.ranks, from_hex(id->second));
  ExternalMemory memory;
  memory.base = session->allocate(bytes);
  memory.bytes = bytes;
  const int domain_start = setup.node_rank * setup.ranks;
  memory.peer = [session, base = memory.base, domain_start](int j) {
    return session->peer_address(base, domain_start + j, "local rank " + std::to_string(j));
  };
  // nvshmem_free barriers over every PE: only a collective release may call it; otherwise the
  // buffer is leaked (NVSHMEM frees its heap at exit) rather than waiting for peers that may
  // never free theirs.
  memory.release = [session, base = memory.base](bool collective) {
    if (collective) session->free(base);
  };
  return std::make_unique<SymmetricBuffer>(std::move(memory));
}

TransportHost::TransportHost(const TransportSetup& setup)
    : registered_(setup.registered),
      nodes_(setup.nodes),
      node_rank_(setup.node_rank),
      channels_(setup.channels),
      ranks_(setup.ranks),
      local_rank_(setup.local_rank) {
  setup.check();
  if (nodes_ > 1 && registered_->kind() != HandleKind::kExternal) {
    throw std::logic_error(
        "nvshmem transport: the registered buffer must come from "
        "make_registered (a symmetric allocation)");
  }
  direct_ = setup.flag_option("nvshmem", "nvshmem_direct", true);
  counters_ = allocate_counters(channels_);
  mapped_ = device_zeros<uint8_t*>(size_t(nodes_));
}

TransportHost::~TransportHost() {
  cudaFree(mapped_);
  if (counters_ != nullptr) cudaFree(counters_);
}

void TransportHost::connect(const std::vector<std::string>& blobs) {
  if (int(blobs.size()) != nodes_) {
    throw std::invalid_argument("transport connect: expected " + std::to_string(nodes_) +
                                " bootstrap blobs (one per domain), got " +
                                std::to_string(blobs.size()));
  }
  connected_ = false;
  // nvshmem_ptr of each other domain's peer: where NVSHMEM maps its heap (P2P/NVLink) the
  // kernels store into it themselves (transport_backend.cuh says why); null entries (another
  // host, or no P2P path) keep NVSHMEM's puts. Null is no error here, unlike the NVLink
  // domain's peer_address.
  std::vector<uint8_t*> mapped(size_t(nodes_), nullptr);
  if (nodes_ > 1 && direct_) {
    const std::shared_ptr<nvshmem::Session> session = nvshmem::Session::live();
    if (!session) {
      throw std::logic_error(
          "nvshmem transport connect: no NVSHMEM session (the registered buffer must come "
          "from make_registered)");
    }
    for (int n = 0; n < nodes_; ++n) {
      if (n == node_rank_) continue;
      mapped[n] = session->mapped_address(registered_->local(), n * ranks_ + local_rank_);
    }
  }
  HYBRID_EP_CUDA_CHECK(
      cudaMemcpy(mapped_, mapped.data(), sizeof(uint8_t*) * mapped.size(), cudaMemcpyHostToDevice));
  needs_registered_ = some_peer_unmapped(mapped, node_rank_);
  connected_ = true;
}

TransportContext TransportHost::context() const {
  if (!connected_) throw std::logic_error("transport: connect() first");
  return TransportContext{registered_->local(), mapped_,   counters_, nodes_,
                          node_rank_,           channels_, ranks_,    local_rank_,
                          needs_registered_};
}

std::vector<ChannelCounters> TransportHost::counters() const {
  return read_counters(counters_, channels_);
}

void TransportHost::reset_counters() { zero_counters(counters_, channels_); }

}  // namespace hybrid_ep
