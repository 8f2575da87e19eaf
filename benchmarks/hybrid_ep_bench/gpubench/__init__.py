"""``hybrid-ep bench --device cuda``: the CUDA engine on GPUs, verified, timed, and compared with
ceilings measured in the same run.

Two regimes (benchmarks/README.md; defaults of ``--device cuda``):

- ``hbm``: 4 and 8 ranks sharing one GPU (MPS), 16 SMs per rank. The kernels together can saturate
  HBM: each is compared with the HBM roofline, a device-to-device copy measured in the run.
- ``sm``: 1 rank and 2 ranks, 8 SMs per rank. HBM is far from busy: each kernel is compared with
  the per-SM TMA ceiling of its traffic pattern, measured in the run by ``_C.copy_ceiling``
  (fan-out: 1 load to k stores, like dispatch; fan-in: k loads to 1 store, like combine; k the
  measured average copies per token).

Every configuration runs in its own set of spawned processes (one per rank, rank r on GPU
r % device_count, gloo group). Per rank and operation it records:

- API time: the whole Python call, from an idle GPU to ``torch.cuda.synchronize()``, several
  ranks starting at one instant of the host's monotonic clock that they agree on first (a
  lone rank needs none);
- kernel-only time: the device time of the operation's core kernel (``dispatch_kernel`` or
  ``combine_kernel``) from ``torch.profiler``, in a separate pass (the profiler is off while API
  times are taken) where ranks sharing a GPU start each call's work at one instant of the GPU's
  global timer (a start gate kernel), so that it leaves out the hosts' skew: a dispatch with a
  handle has no domain barrier, and an early rank's kernel would count its wait for a late one;
- bytes: rows received (``D``) and copies sent (``S``) per call, from the handle.

Operations, each call with fresh random routing (top-k of uniform scores):
``dispatch bf16 + preprocess`` (no handle: the routing all-gather and metadata run in the call),
``dispatch bf16`` and ``dispatch fp8`` (handle of that dispatch), ``combine bf16`` (of the
dispatched BF16 rows), ``combine bf16, input in place`` (the same rows copied, untimed, into the
tensor ``get_combine_input_buffer`` hands out, as an expert writing its output there would: the
call stages nothing; must equal ``combine bf16``), and (unless ``--no-permute``)
``dispatch bf16 + permute`` (``dispatch_with_permute``, fresh routing, pad_multiple 16; kernel
time = dispatch_kernel + permute_kernel), ``dispatch bf16 + fused permute`` (the same call
with fuse_permute_dispatch: one dispatch_kernel grid whose extra blocks permute,
``--permute-blocks`` of them per rank; its outputs must equal the standalone ones),
``unpermute + combine`` (``combine_with_unpermute`` of its rows through the identity expert;
unpermute_kernel + combine_kernel) and ``fused unpermute + combine`` (the same with
fuse_unpermute_combine, of the fused op's rows: one combine_kernel grid with unpermute blocks;
must equal the standalone). The first warm-up call of each is checked bit for bit against an
independent oracle (:mod:`hybrid_ep_bench.oracle`, on the GPU: every rank regenerates every rank's
inputs from their seeds and gathers their routing; the permute pair by its round trip: each
token comes back as BF16(row x experts selected), its probs unchanged), so no number of a wrong
kernel is reported.

Numbers (per configuration and operation; "ranks on a GPU" share its HBM):

- algbw per rank = D x hidden x 2 / time (FP8: x (1 + 4/128) / 2; combine: as BF16 dispatch),
  mean over ranks, for kernel and API time;
- HBM bytes a kernel must move once, per rank: dispatch reads its T rows (+ probs, + scales) and
  writes S copies of them (+ probs, + scales each); combine reads the S copies of its tokens
  (+ their probs) and writes T rows (+ T x E_total probs); permute adds reading the D received
  rows and writing the P permuted ones (+ a prob each), unpermute reading P rows and writing D
  fp32 sums, which its combine pulls as fp32 copies;
- HBM traffic per SM = sum over the ranks on a GPU of bytes / kernel time, / (SMs per rank x
  ranks on it); roofline fraction = the same sum / the measured copy bandwidth (read + write);
- ceiling fraction (sm regime) = traffic per SM / the copy kernel's traffic per SM at the same
  k (interpolated between the integer neighbours of the measured k): the best of a few variants
  (store lanes, in-flight store groups), same rows and SMs, the deepest ring shared memory
  holds, event-timed with the GPU kept busy before the start event (no launch overhead), its
  output checked;
- API allowance = kernel time + one pass over the output (read + write, summed over the ranks on
  the GPU) at the roofline + 30 us;
- API floor = the API time (same timing) of one empty kernel launched and synchronised: the
  launch and wake-up latency under every call, which with several ranks sharing a GPU under MPS
  no library call avoids.
"""

from .config import GpuBenchConfig
from .report import run

__all__ = ["GpuBenchConfig", "run"]
