// The zero-copy pool: a region of the registered buffer handed out block by block as the
// storage of ordinary torch tensors (dispatch outputs, combine inputs), so that peers write
// and read them in place (docs/zero-copy.md). Host-side bookkeeping only: first fit over the
// free ranges, neighbours merged on free. Blocks keep the registered buffer alive: a runtime
// replaced or destroyed while tensors still use its pool leaves its memory to the last block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace hybrid_ep {

class SymmetricBuffer;

struct PoolStats {
  size_t bytes = 0;         // the pool's size
  size_t in_use = 0;        // bytes of live blocks
  size_t largest_free = 0;  // the largest block that could be handed out now
  size_t blocks = 0;        // live blocks
};

class PoolArena {
 public:
  // Blocks start at multiples of this (TMA and vector accesses need 16 bytes; 512 keeps
  // every tensor view of a block on its own cache lines).
  static constexpr size_t kAlign = 512;

  // `bytes` at `base` inside `owner`'s memory (from the first kAlign boundary on).
  PoolArena(std::shared_ptr<SymmetricBuffer> owner, uint8_t* base, size_t bytes);

  // A block of at least `bytes` (rounded up to kAlign), or nullptr when no free range holds it.
  uint8_t* allocate(size_t bytes);
  // Returns a block allocate() handed out; throws std::invalid_argument for any other address.
  void free(uint8_t* block);
  // Whether [address, address + bytes) lies inside one live block.
  bool holds(const void* address, size_t bytes) const;
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  PoolStats stats() const;

 private:
  std::shared_ptr<SymmetricBuffer> owner_;
  uint8_t* base_;
  size_t bytes_;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes, disjoint and never adjacent
  std::map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace hybrid_ep
