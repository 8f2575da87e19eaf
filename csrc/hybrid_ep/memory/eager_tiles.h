// The eager form's tile layout (DESIGN.md section 7; issue 35): a chunk's payload between two
// domains goes out as tiles of one network MTU, 4 KiB: up to 4080 bytes of data and then a
// 16-byte signal, put as one write. A NIC that writes a packet's bytes in address order (the
// preconditions each backend checks) makes the signal land after the data it follows, so the
// receiver polls each tile's signal in place and consumes the tile once it matches: no atomic
// or fence after the data.
//
// The payload of a chunk is one record per row (EagerPayload). Tile t carries payload bytes
// [t * 4080, (t + 1) * 4080), the last tile fewer; its signal follows its data at the next
// 16-byte boundary, so a full tile is exactly 4096 bytes on the wire and a short last tile its
// data rounded up plus 16.
// Tiles sit back to back in the receive slot, 4096 bytes apart.
//
// A signal's value comes from the call's monotonic epoch and the chunk's sequence number in
// the call, so that nothing is ever reset: a slot reused by a later chunk or call expects a
// value its earlier writes never held, and the zeroed memory of a slot never written matches
// no expected value. Host code (the binding the CPU tests use) compiles these too.
#pragma once

#include <cuda_runtime_api.h>  // __host__ __device__ for the host compiler

#include <cstdint>

namespace hybrid_ep {

struct EagerSignal {
  uint64_t value;  // eager_signal_value(epoch, sequence), written last (a release store)
  // The GPU global-timer instant from which the tile counts as delivered: 0 on a real network
  // (it is there once its signal is); the p2p build's emulated wire (wire_model.cuh) writes
  // when its NIC would have delivered the tile, and the receiver waits for that instant too.
  uint64_t visible_ns;
};
static_assert(sizeof(EagerSignal) == 16, "a tile's signal is 16 bytes");

struct EagerTiles {
  static constexpr int64_t kTileBytes = 4096;
  static constexpr int64_t kSignalBytes = sizeof(EagerSignal);
  static constexpr int64_t kDataBytes = kTileBytes - kSignalBytes;  // 4080, a multiple of 16
  static constexpr int64_t kAlign = 16;

  __host__ __device__ static constexpr int64_t align(int64_t bytes) {
    return (bytes + kAlign - 1) / kAlign * kAlign;
  }
  // Tiles of a payload of `bytes` (none for an empty chunk).
  __host__ __device__ static constexpr int64_t count(int64_t bytes) {
    return (bytes + kDataBytes - 1) / kDataBytes;
  }
  // Data bytes of tile t of a payload of `bytes`.
  __host__ __device__ static constexpr int64_t data_bytes(int64_t bytes, int64_t t) {
    const int64_t rest = bytes - t * kDataBytes;
    return rest < kDataBytes ? rest : kDataBytes;
  }
  // Where tile t's signal starts, from the tile's start.
  __host__ __device__ static constexpr int64_t signal_offset(int64_t bytes, int64_t t) {
    return align(data_bytes(bytes, t));
  }
  // Where tile t's signal is, from the slot's start.
  __host__ __device__ static constexpr int64_t signal_at(int64_t bytes, int64_t t) {
    return t * kTileBytes + signal_offset(bytes, t);
  }
  // Bytes of tile t on the wire: its data, padding to 16, its signal.
  __host__ __device__ static constexpr int64_t tile_wire_bytes(int64_t bytes, int64_t t) {
    return signal_offset(bytes, t) + kSignalBytes;
  }
  // Bytes the whole payload takes in a receive slot (and on the wire).
  __host__ __device__ static constexpr int64_t wire_bytes(int64_t bytes) {
    return bytes == 0 ? 0
                      : (count(bytes) - 1) * kTileBytes + tile_wire_bytes(bytes, count(bytes) - 1);
  }
  // Where payload byte b lands in the slot.
  __host__ __device__ static constexpr int64_t wire_offset(int64_t b) {
    return b / kDataBytes * kTileBytes + b % kDataBytes;
  }
  // Bytes of a receive slot for payloads of up to `bytes`: whole tiles, so that every slot of
  // a ring of them starts 4 KiB-aligned.
  __host__ __device__ static constexpr int64_t slot_bytes(int64_t bytes) {
    return count(bytes) * kTileBytes;
  }
  // Payload bytes from b on that lie in b's tile, up to `end`: a copy of [b, end) in the slot
  // is one contiguous piece per tile.
  __host__ __device__ static constexpr int64_t piece(int64_t b, int64_t end) {
    const int64_t tile_end = (b / kDataBytes + 1) * kDataBytes;
    return (end < tile_end ? end : tile_end) - b;
  }
  // The tiles holding payload bytes [begin, end) (end > begin): first and last, inclusive.
  __host__ __device__ static constexpr int64_t first_tile(int64_t begin) {
    return begin / kDataBytes;
  }
  __host__ __device__ static constexpr int64_t last_tile(int64_t end) {
    return (end - 1) / kDataBytes;
  }
};

// A chunk's payload: one record per row, its data, then its probs, then its FP8 scales (0
// bytes: no such part), each part and each record from a 16-byte boundary. Per row rather than
// per part, so that a row is complete once its own tiles have landed, and a receiver forwards
// it without waiting for the tiles of the rows after it.
struct EagerPayload {
  int64_t rows, row_bytes, prob_bytes, scale_bytes;
  int64_t probs_at, scales_at, record;  // offsets in a record, and its size

  __host__ __device__ static constexpr EagerPayload make(int64_t rows, int64_t row_bytes,
                                                         int64_t prob_bytes, int64_t scale_bytes) {
    const int64_t probs_at = EagerTiles::align(row_bytes);
    const int64_t scales_at = EagerTiles::align(probs_at + prob_bytes);
    return {rows,
            row_bytes,
            prob_bytes,
            scale_bytes,
            probs_at,
            scales_at,
            EagerTiles::align(scales_at + scale_bytes)};
  }
  __host__ __device__ constexpr int64_t bytes() const { return rows * record; }
  __host__ __device__ constexpr int64_t row_at(int64_t r) const { return r * record; }
  // Just past the last byte row r uses (its scales, probs or data).
  __host__ __device__ constexpr int64_t row_end(int64_t r) const {
    return row_at(r) + (scale_bytes > 0  ? scales_at + scale_bytes
                        : prob_bytes > 0 ? probs_at + prob_bytes
                                         : row_bytes);
  }
  // The tiles row r needs, inclusive.
  __host__ __device__ constexpr int64_t first_tile_of(int64_t r) const {
    return EagerTiles::first_tile(row_at(r));
  }
  __host__ __device__ constexpr int64_t last_tile_of(int64_t r) const {
    return EagerTiles::last_tile(row_end(r));
  }
};

// Sequence numbers of the chunks of one call (their index in it) take the low bits.
constexpr int kEagerSequenceBits = 24;

// The value tile signals of chunk `sequence` of the call numbered `epoch` (per channel and
// peer, counting from 0) carry; never 0. Distinct for every (epoch, sequence) until the epoch
// passes 2^40, where it wraps: a slot's expected value then comes round again only after 2^40
// calls, which no slot outlives.
__host__ __device__ inline uint64_t eager_signal_value(uint64_t epoch, uint32_t sequence) {
  const uint64_t packed =
      epoch << kEagerSequenceBits | (sequence & ((1u << kEagerSequenceBits) - 1));
  return packed == ~uint64_t(0) ? 1 : packed + 1;
}

}  // namespace hybrid_ep
