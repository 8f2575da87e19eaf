// NVSHMEM for this process: one session, shared by every buffer that spans several NVLink
// domains. NVSHMEM is process-global and is initialised once, from a unique id made by the
// group's rank 0 and handed to every rank through the group (hybrid_ep/transport_bootstrap.py);
// the status-returning nvshmemi_init_thread is used, never nvshmem_init/nvshmemx_init_attr,
// which exit(-1) on failure. Every failure throws TransportUnavailable naming the call, the
// status and how far NVSHMEM got (status.h).
//
// There is no finalize: it is collective (it barriers) and a later init would not bootstrap
// again in every process, so NVSHMEM lives until exit, where it cleans up itself. The session's
// reference count only says whether a buffer still uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace hybrid_ep::nvshmem {

// Without touching the GPU: the loaded libnvshmem_host.so.3 satisfies NVSHMEM's version rule
// for this build, and the plugins NVSHMEM will dlopen from its folder load (the unique-id
// bootstrap; the IBGDA transport when NVSHMEM_IB_ENABLE_IBGDA=1). Returns what was found.
std::string preflight();

// A fresh unique id (sizeof(nvshmemx_uniqueid_t) = 128 bytes) for rank 0 to share; empty when
// NVSHMEM is initialised in this process already (it would not bootstrap again).
std::string make_unique_id();

class Session {
 public:
  // The process's session as PE `rank` of `world` (the group's rank and size); the first call
  // initialises NVSHMEM from `unique_id` (rank 0's make_unique_id()). Throws
  // TransportUnavailable, also when an earlier buffer of this process used another group.
  static std::shared_ptr<Session> join(int rank, int world, const std::string& unique_id);
  // The session a buffer of this process holds, or null when none does.
  static std::shared_ptr<Session> live();

  int rank() const { return rank_; }
  int world() const { return world_; }
  // Collective over every PE: a symmetric allocation of `bytes`, the same size on all PEs.
  uint8_t* allocate(size_t bytes) const;
  // Collective over every PE (it barriers).
  void free(uint8_t* base) const;
  // PE `pe`'s copy of the symmetric `base`, mapped for loads and stores from this GPU; throws
  // naming `who` when NVSHMEM cannot map it (another host, or no P2P path).
  uint8_t* peer_address(uint8_t* base, int pe, const std::string& who) const;
  // The same address, or null where NVSHMEM does not map PE `pe`'s heap here (another host,
  // or no P2P path): then NVSHMEM's own puts reach it.
  uint8_t* mapped_address(uint8_t* base, int pe) const;

  Session(int rank, int world) : rank_(rank), world_(world) {}

 private:
  int rank_, world_;
};

}  // namespace hybrid_ep::nvshmem
