// One registered device allocation per rank, mapped into every rank of the NVLink domain.
// Handles travel as opaque bytes through the caller's process group (gloo or NCCL alike):
//   export_handle() on every rank -> all-gather -> open_peers(all handles of the domain).
// Two kinds: CUDA IPC (default; also between processes sharing one GPU under MPS) and cuMem
// fabric handles for multi-node NVLink (USE_MNNVL=1). A third, external, wraps memory a
// transport library allocated (its symmetric heap): that library maps the peers itself, so
// there is no handle to export and open_peers() asks it for each peer's address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hybrid_ep {

enum class HandleKind { kCudaIpc, kFabric, kExternal };

// Device memory allocated by someone else, with how to reach the peers' copies and free it.
struct ExternalMemory {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  // Local rank j's buffer in this address space; throws when j cannot be reached.
  std::function<uint8_t*(int local_rank)> peer;
  // Frees `base`. `collective`: every rank of the group frees its buffer now, together (see
  // SymmetricBuffer::release_collectively); otherwise the owner may have to leak it.
  std::function<void(bool collective)> release;
};

// A peer's allocation mapped into this process from its exported handle bytes.
struct PeerMapping {
  uint8_t* address = nullptr;
  unsigned long long imported = 0;  // cuMem allocation handle (fabric kind)
};
// `who` names the peer in errors (a malformed handle). Throws CudaError on a failed call.
PeerMapping map_peer(HandleKind kind, const std::string& handle, size_t bytes,
                     const std::string& who);
void unmap_peer(HandleKind kind, const PeerMapping& mapping, size_t bytes) noexcept;

class SymmetricBuffer {
 public:
  SymmetricBuffer(size_t bytes, HandleKind kind);
  explicit SymmetricBuffer(ExternalMemory memory);  // kExternal; zeroes the memory
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  std::string export_handle() const;  // empty for kExternal
  // `handles[j]` is local rank j's export; `self` is this rank's index among them.
  void open_peers(const std::vector<std::string>& handles, int self);

  uint8_t* local() const { return local_; }
  size_t bytes() const { return bytes_; }
  HandleKind kind() const { return kind_; }
  // Device array of the peers' base addresses, valid after open_peers().
  uint8_t* const* peer_table() const { return peer_table_; }
  const std::vector<uint8_t*>& peers() const { return peers_; }
  // Declares that every rank of the group destroys its buffer now, together: an external
  // buffer whose free is collective may then free it instead of leaking it.
  void release_collectively() { collective_release_ = true; }
  // The eager form towards RDMA peers: sets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on a cudaMalloc'd
  // (CUDA IPC) buffer, so synchronous copies into it complete before a NIC reads it. Fabric
  // (cuMem) and external buffers are left as their allocator made them. Throws CudaError.
  void synchronize_memops();

 private:
  void close_peers() noexcept;

  size_t bytes_ = 0;
  HandleKind kind_;
  uint8_t* local_ = nullptr;
  unsigned long long local_handle_ = 0;  // cuMem allocation handle (fabric kind)
  std::vector<uint8_t*> peers_;
  std::vector<PeerMapping> mappings_;
  uint8_t** peer_table_ = nullptr;
  int self_ = -1;
  ExternalMemory external_;  // kExternal only
  bool collective_release_ = false;
};

}  // namespace hybrid_ep
