// The shared-memory ring between a block's producer, which TMA-loads items into stages, and its
// consumers, which read them out; the same protocol in every ring kernel (in the spirit of
// CUTLASS's PipelineTmaAsync). Each stage has two mbarriers of one arrival each:
//   full  : the producer arrives once per item, announcing the bytes its TMA loads bring
//           (expect, then load); the phase completes when they have landed. An item passed on
//           without data (skip) completes it at once, so that its consumer still finishes;
//   empty : the one consumer of the item hands the stage back (release).
// Every role keeps the RingPos (stage and phase parity) of its next item itself: the producer's
// walks every item, a consumer's jumps to its own items (every Nth, or its copies), and an
// item is released by exactly one consumer. A producer waits on the opposite parity of its
// item's phase (acquire), so in the first round every stage counts as handed back.
// A consumer whose TMA bulk stores read the stage releases it only once those reads are done
// (cp.async.bulk.wait_group.read): the stage is then free for the next load.
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/ring_pos.cuh"
#include "hybrid_ep/kernels/common/smem_plan.h"

namespace hybrid_ep {

struct Ring {
  uint8_t* base;  // stage s at base + s * stride
  uint64_t* full;
  uint64_t* empty;
  int stride;
  int stages;

  // The ring of `plan` in the block's shared memory at `smem`.
  __device__ static Ring carve(uint8_t* smem, const SmemPlan& plan) {
    return {smem, reinterpret_cast<uint64_t*>(smem + plan.full),
            reinterpret_cast<uint64_t*>(smem + plan.empty), plan.stride, plan.stages};
  }

  __device__ uint8_t* stage(int s) const { return base + size_t(s) * stride; }

  // One thread, before the block synchronises: every barrier with its one arrival, made
  // visible to the TMA unit.
  __device__ void init() const {
    for (int s = 0; s < stages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], 1);
    }
    ptx::fence_barrier_init();
  }

  // Producer: waits until the stage of the item at `at` was handed back.
  __device__ void acquire(RingPos at) const { ptx::mbar_wait(&empty[at.stage], at.phase ^ 1); }
  // Producer: the item in stage `s` brings `bytes` in all, by the loads that follow.
  __device__ void expect(int s, uint32_t bytes) const {
    ptx::mbar_arrive_expect_tx(&full[s], bytes);
  }
  // Producer: a TMA load of `bytes` from `src` to `offset` in stage `s`.
  __device__ void load(int s, uint32_t offset, const void* src, uint32_t bytes) const {
    ptx::bulk_load(stage(s) + offset, src, bytes, &full[s]);
  }
  // Producer: the item in stage `s` goes on without data.
  __device__ void skip(int s) const { ptx::mbar_arrive(&full[s]); }

  // Consumer: waits until the item at `at` has landed.
  __device__ void wait(RingPos at) const { ptx::mbar_wait(&full[at.stage], at.phase); }
  // Consumer: hands stage `s` back to the producer.
  __device__ void release(int s) const { ptx::mbar_arrive(&empty[s]); }
};

}  // namespace hybrid_ep
