// One registered device allocation per rank, mapped into every rank of the NVLink domain.
// Handles travel as opaque bytes through the caller's process group (gloo or NCCL alike):
//   export_handle() on every rank -> all-gather -> open_peers(all handles of the domain).
// Two kinds: CUDA IPC (default; also between processes sharing one GPU under MPS) and cuMem
// fabric handles for multi-node NVLink (USE_MNNVL=1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hybrid_ep {

enum class HandleKind { kCudaIpc, kFabric };

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
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  std::string export_handle() const;
  // `handles[j]` is local rank j's export; `self` is this rank's index among them.
  void open_peers(const std::vector<std::string>& handles, int self);

  uint8_t* local() const { return local_; }
  size_t bytes() const { return bytes_; }
  HandleKind kind() const { return kind_; }
  // Device array of the peers' base addresses, valid after open_peers().
  uint8_t* const* peer_table() const { return peer_table_; }
  const std::vector<uint8_t*>& peers() const { return peers_; }

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
};

}  // namespace hybrid_ep
