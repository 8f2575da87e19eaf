// Python face of Runtime and the executor. Pointers and streams arrive as integers
// (tensor.data_ptr(), torch.cuda.current_stream().cuda_stream): the core never sees torch.
#include "hybrid_ep/bindings/runtime.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "hybrid_ep/bindings/pool_tensor.h"
#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/executor/executor.h"
#include "hybrid_ep/runtime/runtime.h"

namespace py = pybind11;

namespace hybrid_ep {
namespace {

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

py::dict status_dict(const DeviceStatus& s) {
  py::dict d;
  d["code"] = s.code;
  d["site"] = s.site;
  d["peer"] = s.peer;
  d["slot"] = s.slot;
  d["expected"] = s.expected;
  d["seen"] = s.seen;
  d["stamp"] = s.stamp;
  return d;
}

}  // namespace

void register_runtime(py::module_& m) {
  // The codes and wait sites of DeviceStatus (common/status.h): the Python side names a
  // failure from these instead of copies of the numbers.
  py::enum_<StatusCode>(m, "StatusCode")
      .value("kOk", StatusCode::kOk)
      .value("kTimeout", StatusCode::kTimeout)
      .value("kMismatch", StatusCode::kMismatch);
  py::enum_<WaitSite>(m, "WaitSite")
      .value("kBarrier", WaitSite::kBarrier)
      .value("kAllgather", WaitSite::kAllgather)
      .value("kDispatchChunk", WaitSite::kDispatchChunk)
      .value("kNetworkFlag", WaitSite::kNetworkFlag)
      .value("kNetworkCombine", WaitSite::kNetworkCombine)
      .value("kNetworkBarrier", WaitSite::kNetworkBarrier)
      .value("kNetworkAllgather", WaitSite::kNetworkAllgather)
      .value("kForward", WaitSite::kForward)
      .value("kUnpermuteChunk", WaitSite::kUnpermuteChunk)
      .value("kReceiveRelease", WaitSite::kReceiveRelease)
      .value("kGatheredStamps", WaitSite::kGatheredStamps)
      .value("kDispatchCredit", WaitSite::kDispatchCredit)
      .value("kCombineCredit", WaitSite::kCombineCredit)
      .value("kCombinePulled", WaitSite::kCombinePulled);

  py::class_<RuntimeConfig>(m, "RuntimeConfig")
      .def(py::init<>())
      .def_readwrite("world", &RuntimeConfig::world)
      .def_readwrite("ranks", &RuntimeConfig::ranks)
      .def_readwrite("nodes", &RuntimeConfig::nodes)
      .def_readwrite("node_rank", &RuntimeConfig::node_rank)
      .def_readwrite("local_rank", &RuntimeConfig::local_rank)
      .def_readwrite("experts_per_rank", &RuntimeConfig::experts_per_rank)
      .def_readwrite("max_tokens", &RuntimeConfig::max_tokens)
      .def_readwrite("max_received", &RuntimeConfig::max_received)
      .def_readwrite("zero_copy_pool_bytes", &RuntimeConfig::zero_copy_pool_bytes)
      .def_readwrite("hidden", &RuntimeConfig::hidden)
      .def_readwrite("dispatch_chunk", &RuntimeConfig::dispatch_chunk)
      .def_readwrite("combine_chunk", &RuntimeConfig::combine_chunk)
      .def_readwrite("stages_dispatch", &RuntimeConfig::stages_dispatch)
      .def_readwrite("stages_combine", &RuntimeConfig::stages_combine)
      .def_readwrite("sms_dispatch", &RuntimeConfig::sms_dispatch)
      .def_readwrite("sms_combine", &RuntimeConfig::sms_combine)
      .def_readwrite("sms_preprocessing", &RuntimeConfig::sms_preprocessing)
      .def_readwrite("timeout_s", &RuntimeConfig::timeout_s)
      .def_readwrite("combine_pieces", &RuntimeConfig::combine_pieces)
      .def_readwrite("channels", &RuntimeConfig::channels)
      .def_readwrite("fabric", &RuntimeConfig::fabric)
      .def_readwrite("combine_wire_fp32", &RuntimeConfig::combine_wire_fp32)
      .def_readwrite("prob_puts_per_token", &RuntimeConfig::prob_puts_per_token)
      .def_readwrite("eager", &RuntimeConfig::eager)
      .def_readwrite("net_ring_chunks", &RuntimeConfig::net_ring_chunks)
      .def_readwrite("withhold_dispatch_credits", &RuntimeConfig::withhold_dispatch_credits)
      .def_readwrite("stage_network_sources", &RuntimeConfig::stage_network_sources)
      .def_readwrite("unmapped_peers", &RuntimeConfig::unmapped_peers)
      .def_readwrite("withhold_combine_credits", &RuntimeConfig::withhold_combine_credits)
      .def_readwrite("transport_options", &RuntimeConfig::transport_options);

  py::class_<Runtime> runtime(m, "Runtime");
  register_pool_tensor(m, runtime);
  runtime.def(py::init<const RuntimeConfig&>(), py::call_guard<py::gil_scoped_release>())
      .def_static("bytes_for", &Runtime::registered_bytes,
                  "Bytes of the registered buffer a Runtime of this config allocates.")
      .def("release", &Runtime::release, py::call_guard<py::gil_scoped_release>(),
           "Collective, the last call: frees the transport and the registered buffer now.")
      .def("export_handle", [](const Runtime& r) { return py::bytes(r.export_handle()); })
      .def("open_peers",
           [](Runtime& r, const std::vector<py::bytes>& handles) {
             std::vector<std::string> raw(handles.begin(), handles.end());
             r.open_peers(raw);
           })
      .def("transport_bootstrap",
           [](const Runtime& r) { return py::bytes(r.transport_bootstrap()); })
      .def("connect_transport",
           [](Runtime& r, const std::vector<py::bytes>& blobs) {
             std::vector<std::string> raw(blobs.begin(), blobs.end());
             r.connect_transport(raw);
           })
      .def("transport_counters",
           [](const Runtime& r) {
             py::list out;
             for (const ChannelCounters& c : r.transport_counters()) {
               py::dict d;
               d["puts"] = c.puts;
               d["signals"] = c.signals;
               d["bytes"] = c.bytes;
               d["eager_tiles"] = c.eager_tiles;
               out.append(d);
             }
             return out;
           })
      .def("reset_transport_counters", &Runtime::reset_transport_counters)
      .def(
          "barrier", [](Runtime& r, uintptr_t stream) { run_barrier(r, stream_of(stream)); },
          py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
          "The barrier between operations alone, on `stream` (no stamp compared): the bench's "
          "floor of a call that meets every rank.")
      .def(
          "transport_check",
          [](Runtime& r, size_t bytes, int channel, uintptr_t stream) {
            return run_transport_check(r, bytes, channel, stream_of(stream));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "transport_check_timed",
          [](Runtime& r, size_t bytes, int channel, uintptr_t stream) {
            std::vector<uint64_t> times;
            const unsigned long long wrong =
                run_transport_check(r, bytes, channel, stream_of(stream), &times);
            const size_t nodes = times.size() / 2;
            // A std::tuple: it becomes a Python tuple after the call, with the GIL held.
            return std::make_tuple(wrong,
                                   std::vector<uint64_t>(times.begin(), times.begin() + nodes),
                                   std::vector<uint64_t>(times.begin() + nodes, times.end()));
          },
          py::call_guard<py::gil_scoped_release>(),
          "transport_check, also returning (put times per domain, signal-seen times per "
          "domain) in global-timer ns")
      .def(
          "network_send_check",
          [](Runtime& r, uintptr_t goes, uintptr_t rows, int num_tokens, int row_bytes, int blocks,
             uintptr_t stream) {
            run_network_send_check(r, ptr<const bool>(goes), ptr<const uint8_t>(rows), num_tokens,
                                   row_bytes, blocks, stream_of(stream));
          },
          py::call_guard<py::gil_scoped_release>())
      .def("layout_offsets",
           [](const Runtime& r) {
             const BufferLayout& l = r.layout();
             py::dict d;
             d["net_rows"] = l.net_rows;
             d["net_ring_chunks"] = r.shape().net_ring_chunks;
             d["dispatch_rows"] = l.dispatch_rows;
             d["network_flags"] = l.network_flags;
             d["combine_rows"] = l.combine_rows;
             d["combine_probs"] = l.combine_probs;
             d["total"] = l.total;
             return d;
           })
      .def("copy_registered",
           [](const Runtime& r, size_t offset, size_t bytes, uintptr_t dst, uintptr_t stream) {
             if (offset + bytes > r.layout().total) {
               throw std::invalid_argument("copy_registered: bytes past the registered buffer");
             }
             HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(ptr<uint8_t>(dst), r.registered() + offset, bytes,
                                                  cudaMemcpyDeviceToDevice, stream_of(stream)));
           })
      .def("peer_bases",
           [](const Runtime& r) {
             std::vector<uintptr_t> v;
             for (uint8_t* b : r.peer_bases()) v.push_back(reinterpret_cast<uintptr_t>(b));
             return v;
           })
      .def("registered_bytes", [](const Runtime& r) { return r.layout().total; })
      .def("status", [](const Runtime& r) { return status_dict(r.status()); })
      // Every call checks this first: no dict to build while nothing failed.
      .def("status_code", [](const Runtime& r) { return int(r.status().code); })
      .def("begin_call", &Runtime::begin_call, py::arg("stamp"))
      .def("summary",
           [](const Runtime& r) {
             const PreprocessSummary& s = r.host_summary();
             int64_t routed = 0;  // the most rows routed to a rank of this domain
             for (int j = 0; j < r.config().ranks; ++j) routed = std::max(routed, s.routed[j]);
             return py::make_tuple(s.dispatched, s.largest, s.own_begin, s.own_end, routed);
           })
      .def("preprocess",
           [](Runtime& r, uintptr_t routing_map, int num_tokens, uintptr_t s2d, uintptr_t r2a,
              uintptr_t a2r, uintptr_t num_dispatched, uintptr_t lerm, uintptr_t chunk_layout,
              uintptr_t dropped, uintptr_t stream) {
             run_preprocess(r,
                            {ptr<const uint8_t>(routing_map), num_tokens, ptr<int32_t>(s2d),
                             ptr<bool>(r2a), ptr<bool>(a2r), ptr<int32_t>(num_dispatched),
                             ptr<bool>(lerm), ptr<int32_t>(chunk_layout), ptr<int32_t>(dropped)},
                            stream_of(stream));
           })
      .def("dispatch",
           [](Runtime& r, uintptr_t hidden, uintptr_t probs, uintptr_t scales, uintptr_t s2d,
              uintptr_t a2r, int handle_tokens, int num_tokens, int row_bytes, int scale_cols,
              bool barrier_first, uintptr_t own_rows, uintptr_t own_probs, uintptr_t own_scales,
              uintptr_t zc_rows, uintptr_t zc_probs, uintptr_t zc_scales, int64_t zc_capacity,
              uintptr_t stream) {
             DispatchCall call{ptr<const uint8_t>(hidden),
                               ptr<const float>(probs),
                               ptr<const float>(scales),
                               ptr<const int32_t>(s2d),
                               ptr<const bool>(a2r),
                               handle_tokens,
                               num_tokens,
                               row_bytes,
                               scale_cols,
                               barrier_first,
                               OwnDispatchRows{ptr<uint8_t>(own_rows), ptr<float>(own_probs),
                                               ptr<float>(own_scales)}};
             call.zero_copy = {ptr<uint8_t>(zc_rows), ptr<float>(zc_probs), ptr<float>(zc_scales),
                               zc_capacity};
             return run_dispatch(r, call, stream_of(stream));
           })
      .def("dispatch_permute",
           [](Runtime& r, uintptr_t hidden, uintptr_t probs, uintptr_t scales, uintptr_t s2d,
              uintptr_t a2r, int handle_tokens, int num_tokens, int row_bytes, int scale_cols,
              bool barrier_first, uintptr_t chunk_layout, uintptr_t d2e, uintptr_t row_source,
              int num_permuted, int blocks, uintptr_t out, uintptr_t out_probs,
              uintptr_t out_scales, uintptr_t stream) {
             const FusedPermuteCall permute{ptr<const int32_t>(chunk_layout),
                                            ptr<const int32_t>(d2e),
                                            ptr<const int32_t>(row_source),
                                            num_permuted,
                                            blocks,
                                            ptr<uint8_t>(out),
                                            ptr<float>(out_probs),
                                            ptr<float>(out_scales)};
             return run_dispatch(
                 r,
                 {ptr<const uint8_t>(hidden), ptr<const float>(probs), ptr<const float>(scales),
                  ptr<const int32_t>(s2d), ptr<const bool>(a2r), handle_tokens, num_tokens,
                  row_bytes, scale_cols, barrier_first, OwnDispatchRows{}, &permute},
                 stream_of(stream));
           })
      .def("copy_dispatched",
           [](Runtime& r, uintptr_t rows, uintptr_t probs, uintptr_t scales, int count,
              int row_bytes, int scale_cols, int written_begin, int written_end, uintptr_t stream) {
             copy_dispatched(r,
                             {ptr<uint8_t>(rows), ptr<float>(probs), ptr<float>(scales), count,
                              row_bytes, scale_cols, RowRange{written_begin, written_end}},
                             stream_of(stream));
           })
      .def("permute_layout",
           [](Runtime& r, uintptr_t lerm, int rows, int pad_multiple, int num_permuted,
              uintptr_t d2e, uintptr_t row_source, uintptr_t raw, uintptr_t tpe, uintptr_t overflow,
              int blocks, uintptr_t stream) {
             run_permute_layout(r,
                                {ptr<const bool>(lerm), rows, pad_multiple, num_permuted,
                                 ptr<int32_t>(d2e), ptr<int32_t>(row_source), ptr<int32_t>(raw),
                                 ptr<int64_t>(tpe), ptr<int32_t>(overflow), blocks},
                                stream_of(stream));
           })
      .def("permute",
           [](Runtime& r, uintptr_t row_source, int num_permuted, int row_bytes, int scale_cols,
              bool with_probs, int blocks, uintptr_t out, uintptr_t out_probs, uintptr_t out_scales,
              uintptr_t stream) {
             run_permute(
                 r,
                 {ptr<const int32_t>(row_source), num_permuted, row_bytes, scale_cols, with_probs,
                  blocks, ptr<uint8_t>(out), ptr<float>(out_probs), ptr<float>(out_scales)},
                 stream_of(stream));
           })
      .def("combine",
           [](Runtime& r, uintptr_t hidden, uintptr_t probs, bool with_probs, int num_rows,
              int hidden_size, uintptr_t s2d, uintptr_t r2a, uintptr_t a2r, int handle_tokens,
              int num_tokens, uintptr_t out, uintptr_t out_probs, uintptr_t dense_to_expert_map,
              uintptr_t num_dispatched, int unpermute_blocks, uintptr_t chunk_layout,
              int fused_unpermute_blocks, int own_begin, int own_end, bool claimed,
              uintptr_t stream) {
             return run_combine(
                 r,
                 {ptr<const uint8_t>(hidden), ptr<const float>(probs), with_probs, num_rows,
                  hidden_size, ptr<const int32_t>(s2d), ptr<const bool>(r2a), ptr<const bool>(a2r),
                  handle_tokens, num_tokens, ptr<uint16_t>(out), ptr<float>(out_probs),
                  ptr<const int32_t>(dense_to_expert_map), ptr<const int32_t>(num_dispatched),
                  unpermute_blocks, ptr<const int32_t>(chunk_layout), fused_unpermute_blocks,
                  RowRange{own_begin, own_end}, claimed},
                 stream_of(stream));
           })
      .def(
          "claim_combine_input",
          [](Runtime& r, uintptr_t stream) { claim_combine_input(r, stream_of(stream)); },
          "The combine's first wait, early: the peers are done with this rank's combine region "
          "once the stream passes it (with several domains a barrier, inside one domain the "
          "wait for their pulls of the previous input).")
      .def("registered_address",
           [](const Runtime& r) { return reinterpret_cast<uintptr_t>(r.registered()); });
}

}  // namespace hybrid_ep
