// The transport contract, device side (docs/architecture.md). The backend's header
// `transport_backend.cuh` supplies `struct TransportDevice` with these static members, each
// called by every lane of one warp with the same arguments (`lane` = the caller's lane):
//
//   put(ctx, channel, node, remote_offset, src, bytes, lane)
//       Non-blocking contiguous write of `bytes` from local `src` to offset `remote_offset` of
//       the registered buffer of the peer in domain `node`. Counts one put and `bytes`.
//   signal(ctx, channel, node, flag_offset, value, lane)
//       Adds `value` to the 64-bit flag at `flag_offset` of that peer's registered buffer; the
//       receiver sees it only after every earlier put of this warp on the same channel to the
//       same peer. Counts one signal.
//   flush(ctx, channel, lane)
//       Returns when the sources of this warp's earlier puts on the channel may be reused.
//   mapped(ctx, node) -> uint8_t*
//       The peer of domain `node`'s registered buffer where it is mapped into this process (its
//       memory is reachable by plain stores: one host, NVLink), else null. Any thread.
//   count_stored(ctx, channel, bytes, lane)
//       Counts one put of `bytes` whose data the kernel stored into the mapped peer itself, so
//       that the counters mean the same whether or not a peer is mapped.
//   count_eager_stored(ctx, channel, bytes, tiles, lane) -> EagerDelivery
//       The eager form (memory/eager_tiles.h) into a mapped peer: counts one put of `bytes` in
//       the tile layout and its `tiles` tiles (no signal: each tile carries its own), whose
//       data and signals the kernel stored itself, each signal a release store after its
//       tile's data; returns when those bytes count as delivered (EagerDelivery: at once
//       unless the backend emulates a network). Every lane gets lane 0's result.
//   put_eager(ctx, channel, node, remote_offset, src, payload_bytes, lane)
//       The eager form to a peer that is not mapped: one write of the slot at local `src`
//       (registered), whose tiles of `payload_bytes` of payload the kernel has written, data
//       and signals alike, with plain stores, to offset `remote_offset` at the peer of domain
//       `node`, such that the receiver sees each tile's signal only after that tile's data (an
//       RDMA write on one queue pair of a NIC writing without relaxed ordering: the host
//       enables the form only where that holds, docs/multi-domain.md "Eager form"). The slot
//       may be rewritten once the receiver has credited it back. Counts one put of the wire
//       bytes and its tiles, no signal.
//
// Waiting for a flag is a plain acquire load of local memory and belongs to the kernels
// (kernels/common/flags.cuh). Kernels name no backend: they use TransportDevice.
#pragma once

#include "hybrid_ep/transport/eager_delivery.h"
#include "hybrid_ep/transport/transport.h"
#include "transport_backend.cuh"
