#include "hybrid_ep/memory/pool_arena.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <utility>

namespace hybrid_ep {

PoolArena::PoolArena(std::shared_ptr<SymmetricBuffer> owner, uint8_t* base, size_t bytes)
    : owner_(std::move(owner)) {
  const size_t skip = (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  base_ = base + skip;
  bytes_ = bytes > skip ? (bytes - skip) / kAlign * kAlign : 0;
  if (bytes_ > 0) free_.emplace(0, bytes_);
}

uint8_t* PoolArena::allocate(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t want = (bytes + kAlign - 1) / kAlign * kAlign;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const size_t at = it->first;
    const size_t left = it->second - want;
    free_.erase(it);
    if (left > 0) free_.emplace(at + want, left);
    used_.emplace(at, want);
    return base_ + at;
  }
  return nullptr;
}

void PoolArena::free(uint8_t* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto used = used_.find(size_t(block - base_));
  if (block < base_ || used == used_.end()) {
    throw std::invalid_argument("PoolArena::free: not a block of this pool");
  }
  size_t at = used->first, size = used->second;
  used_.erase(used);
  // Merge with the free neighbours on both sides.
  auto next = free_.lower_bound(at);
  if (next != free_.end() && next->first == at + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      at = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(at, size);
}

bool PoolArena::holds(const void* address, size_t bytes) const {
  const auto* p = static_cast<const uint8_t*>(address);
  if (p < base_ || p + bytes > base_ + bytes_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = used_.upper_bound(size_t(p - base_));
  if (it == used_.begin()) return false;
  --it;
  return size_t(p - base_) + bytes <= it->first + it->second;
}

PoolStats PoolArena::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PoolStats s;
  s.bytes = bytes_;
  s.blocks = used_.size();
  for (const auto& [at, size] : used_) s.in_use += size;
  for (const auto& [at, size] : free_) s.largest_free = std::max(s.largest_free, size);
  return s;
}

}  // namespace hybrid_ep
