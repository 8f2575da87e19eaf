#include "transport_backend.h"

#include <cuda_runtime_api.h>
#include <ucp/api/device/ucp_device_types.h>

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/transport/device_state.h"
#include "hybrid_ep/transport/transport.h"
#include "mapped_views.h"
#include "view_header.h"

namespace hybrid_ep {
namespace {

// Warps of one launch that may keep a put in flight (a slot each); more warps than this post
// with UCP_DEVICE_FLAG_NODELAY instead. 132 SMs x 32 warps covers any launch of ours.
constexpr int kPendingSlots = 132 * 32;

uint64_t view_address(const std::string& blob, int node) {
  if (blob.size() != sizeof(uint64_t)) {
    throw std::invalid_argument("nixl transport connect: the blob of domain " +
                                std::to_string(node) + " has " + std::to_string(blob.size()) +
                                " bytes, expected an 8-byte memory view address");
  }
  uint64_t address = 0;
  std::memcpy(&address, blob.data(), sizeof(address));  // little-endian, as Python packs it
  if (address == 0) {
    throw std::invalid_argument("nixl transport connect: the memory view of domain " +
                                std::to_string(node) + " is null");
  }
  return address;
}

nixl::ViewHeader read_header(uint64_t address) {
  nixl::ViewHeader header{};
  HYBRID_EP_CUDA_CHECK(cudaMemcpy(&header, reinterpret_cast<const void*>(address), sizeof(header),
                                  cudaMemcpyDeviceToHost));
  return header;
}

}  // namespace

static_assert(offsetof(ucp_device_remote_mem_list_t, mem_elements) == sizeof(nixl::ViewHeader) &&
                  offsetof(ucp_device_local_mem_list_t, mem_elements) == sizeof(nixl::ViewHeader),
              "UCX's memory views no longer start with the 8-byte header view_header.h reads");

TransportHost::TransportHost(const TransportSetup& setup)
    : registered_(setup.registered),
      nodes_(setup.nodes),
      node_rank_(setup.node_rank),
      channels_(setup.channels),
      timeout_ns_(setup.timeout_ns) {
  setup.check();
  direct_ = setup.flag_option("nixl", "nixl_direct", true);
  counters_ = allocate_counters(channels_);
  mapped_ = device_zeros<uint8_t*>(size_t(nodes_));
  fault_ = device_zeros<unsigned int>(1);
  if (nodes_ > 1) {
    pending_slots_ = kPendingSlots;
    pending_ = device_zeros<NixlPending>(size_t(pending_slots_));
  }
}

TransportHost::~TransportHost() {
  cudaFree(remote_views_);
  cudaFree(mapped_);
  cudaFree(pending_);
  cudaFree(fault_);
  cudaFree(counters_);
}

std::string TransportHost::preflight() {
  return "nixl: UCX device API " + std::to_string(UCP_DEVICE_MEM_LIST_VERSION_V1) +
         " (memory view layout); the NIXL agent runs in Python (nixl_cu13)";
}

std::string TransportHost::bootstrap() const {
  int device = 0;
  HYBRID_EP_CUDA_CHECK(cudaGetDevice(&device));
  std::ostringstream out;
  out << reinterpret_cast<uintptr_t>(registered_->local()) << ' ' << registered_->bytes() << ' '
      << device;
  return out.str();
}

void TransportHost::connect(const std::vector<std::string>& blobs) {
  if (int(blobs.size()) != nodes_) {
    throw std::invalid_argument("transport connect: expected " + std::to_string(nodes_) +
                                " blobs (one per domain), got " + std::to_string(blobs.size()));
  }
  cudaFree(remote_views_);
  remote_views_ = nullptr;
  local_view_ = nullptr;
  connected_ = false;
  if (nodes_ > 1) {
    std::vector<const ucp_device_remote_mem_list*> remotes(nodes_, nullptr);
    for (int n = 0; n < nodes_; ++n) {
      const uint64_t address = view_address(blobs[n], n);
      const std::string what = n == node_rank_
                                   ? "the local memory view (our domain " + std::to_string(n) + ")"
                                   : "the memory view of domain " + std::to_string(n);
      nixl::check_view_header(read_header(address), UCP_DEVICE_MEM_LIST_VERSION_V1, what,
                              n != node_rank_);
      if (n == node_rank_) {
        local_view_ = reinterpret_cast<const ucp_device_local_mem_list*>(address);
      } else {
        remotes[n] = reinterpret_cast<const ucp_device_remote_mem_list*>(address);
      }
    }
    remote_views_ = device_zeros<const ucp_device_remote_mem_list*>(remotes.size());
    HYBRID_EP_CUDA_CHECK(cudaMemcpy(remote_views_, remotes.data(),
                                    sizeof(remotes[0]) * remotes.size(), cudaMemcpyHostToDevice));
  }
  HYBRID_EP_CUDA_CHECK(cudaMemset(mapped_, 0, sizeof(uint8_t*) * size_t(nodes_)));
  if (nodes_ > 1 && direct_) {
    nixl::resolve_mapped_views(remote_views_, nodes_, mapped_, nullptr);
    HYBRID_EP_CUDA_CHECK(cudaGetLastError());
    HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<uint8_t*> mapped(size_t(nodes_), nullptr);
  HYBRID_EP_CUDA_CHECK(
      cudaMemcpy(mapped.data(), mapped_, sizeof(uint8_t*) * mapped.size(), cudaMemcpyDeviceToHost));
  needs_registered_ = some_peer_unmapped(mapped, node_rank_);
  connected_ = true;
}

TransportContext TransportHost::context() const {
  if (!connected_) throw std::logic_error("transport: connect() first");
  return TransportContext{local_view_,
                          remote_views_,
                          mapped_,
                          registered_->local(),
                          registered_->bytes(),
                          pending_,
                          pending_slots_,
                          counters_,
                          fault_,
                          nodes_,
                          node_rank_,
                          channels_,
                          timeout_ns_};
}

// Also where device-side faults surface: the GPU cannot throw, so it leaves bits in the fault
// word and the next synchronous read reports them.
std::vector<ChannelCounters> TransportHost::counters() const {
  std::vector<ChannelCounters> out = read_counters(counters_, channels_);
  const unsigned int fault = read_fault_bits(fault_);
  if (fault & kNixlFaultSourceOutside) {
    throw std::runtime_error(
        "nixl transport: a put's source was outside this rank's registered buffer; the memory "
        "views name only that buffer, so the kernel must stage its data there first");
  }
  if (fault & kNixlFaultPost) {
    throw std::runtime_error(
        "nixl transport: ucp_device_put or ucp_device_counter_inc returned an error (a view "
        "without a lane for that channel, or an offset past the registered buffer)");
  }
  if (fault & kNixlFaultCompletion) {
    throw std::runtime_error(
        "nixl transport: a flush saw a failed completion or waited a minute for one (peer "
        "gone or link down?)");
  }
  return out;
}

void TransportHost::reset_counters() { zero_counters(counters_, channels_); }

}  // namespace hybrid_ep
