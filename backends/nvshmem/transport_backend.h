// nvshmem transport, host side: with several domains the registered buffer is an NVSHMEM
// symmetric allocation (nvshmem_malloc, the same size and offsets on every PE), so a put to
// the peer of domain n writes `base + offset` on PE n*ranks + local_rank and NVSHMEM picks the
// path (P2P on one host, IBGDA between hosts); the NVLink domain reaches its peers through
// nvshmem_ptr instead of CUDA IPC. With one domain NVSHMEM is never touched: the buffer is the
// p2p build's IPC buffer and there is nothing to connect. Channels only separate the counters
// here (NVSHMEM maps blocks to its queue pairs itself, NVSHMEM_IBGDA_RC_MAP_BY).
// Where NVSHMEM maps a peer's heap into this process (nvshmem_ptr: P2P/NVLink), connect()
// records the address and puts to that peer are our warp's stores (option nvshmem_direct).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hybrid_ep/memory/symmetric_buffer.h"
#include "hybrid_ep/transport/counters.h"

namespace hybrid_ep {

struct TransportSetup;
namespace nvshmem {
class Session;
}

struct TransportContext {
  uint8_t* base;  // this rank's registered buffer: a symmetric address
  // device array [nodes]: the peer's registered buffer where NVSHMEM maps it into this
  // process (nvshmem_ptr), else null (another host; our own domain); puts to a mapped peer
  // are our warp's stores. All null with HYBRID_EP_NVSHMEM_DIRECT=0.
  uint8_t* const* mapped;
  ChannelCounters* counters;  // device array [channels]
  int nodes;
  int node_rank;
  int channels;
  int ranks;  // per domain: the peer of domain n is PE n * ranks + local_rank
  int local_rank;
  // Whether some peer is reached through NVSHMEM's puts (not mapped): only then has a flush
  // anything to complete (nvshmem_quiet, which nothing bounds but the NIC's retry timeout).
  bool posts;
};

class TransportHost {
 public:
  // IBGDA reads a put's source with the heap's key: sources must lie in the symmetric buffer.
  static constexpr bool kRegisteredSources = true;

  explicit TransportHost(const TransportSetup& setup);
  ~TransportHost();
  TransportHost(const TransportHost&) = delete;
  TransportHost& operator=(const TransportHost&) = delete;

  // Checks the loaded NVSHMEM against this build and its plugins, without the GPU.
  static std::string preflight();
  // Rank 0's NVSHMEM unique id (128 bytes); empty when NVSHMEM runs in this process already.
  static std::string unique_id();
  // The error table and version rule (status.h), for the CPU tests.
  static std::string describe_failure(const std::string& call, int status, int stage);
  static std::string version_mismatch(int built_major, int built_minor, int built_patch,
                                      int loaded_major, int loaded_minor, int loaded_patch);
  // One domain: the IPC/fabric buffer. Several: joins the NVSHMEM session (the unique id is
  // the option "unique_id", hex) and allocates the buffer on its symmetric heap.
  static std::unique_ptr<SymmetricBuffer> make_registered(const TransportSetup& setup, size_t bytes,
                                                          HandleKind kind);

  std::string bootstrap() const { return std::string(); }  // NVSHMEM addresses every PE
  void connect(const std::vector<std::string>& blobs);
  TransportContext context() const;
  // After connect: false when every other domain's peer is mapped into this process (all puts
  // are then our stores, which read any device memory), so dispatch need not stage its rows.
  bool needs_registered_sources() const { return needs_registered_; }
  std::vector<ChannelCounters> counters() const;
  void reset_counters();

 private:
  const SymmetricBuffer* registered_;
  int nodes_, node_rank_, channels_, ranks_, local_rank_;
  ChannelCounters* counters_ = nullptr;
  uint8_t** mapped_ = nullptr;  // device
  bool direct_ = true;          // options["nvshmem_direct"]: store into the peers NVSHMEM maps
  bool connected_ = false;
  bool needs_registered_ = true;
};

}  // namespace hybrid_ep
