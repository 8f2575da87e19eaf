// hybrid_ep_bench._C: the Python face of the benchmark's own kernels (the TMA copy ceiling and
// the start gate), apart from the product's hybrid_ep._C. Pointers and streams arrive as
// integers (tensor.data_ptr(), torch.cuda.current_stream().cuda_stream).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep_bench/copy_ceiling.h"
#include "hybrid_ep_bench/start_gate.h"

namespace py = pybind11;
using namespace hybrid_ep;

PYBIND11_MODULE(_C, m) {
  m.doc() = "hybrid-ep benchmark kernels";
  py::register_exception<CudaError>(m, "CudaError", PyExc_RuntimeError);

  m.def(
      "copy_ceiling",
      [](uintptr_t src, uintptr_t dst, int64_t rows, int row_bytes, int k, bool fan_in, int blocks,
         int stages, uintptr_t stream, int in_flight, int store_lanes, int release_every,
         const std::vector<uintptr_t>& copy_dst) {
        CopyCeilingParams p{};
        if (!copy_dst.empty() && int(copy_dst.size()) != k) {
          throw py::value_error("copy_dst: " + std::to_string(copy_dst.size()) +
                                " addresses for k=" + std::to_string(k) + " copies");
        }
        if (int(copy_dst.size()) > kMaxCopyDestinations) {
          throw py::value_error("copy_dst: at most " + std::to_string(kMaxCopyDestinations) +
                                " addresses");
        }
        for (size_t j = 0; j < copy_dst.size(); ++j) {
          p.copy_dst[j] = reinterpret_cast<uint8_t*>(copy_dst[j]);
        }
        p.src = reinterpret_cast<const uint8_t*>(src);
        p.dst = reinterpret_cast<uint8_t*>(dst);
        p.rows = rows;
        p.row_bytes = row_bytes;
        p.k = k;
        p.fan_in = fan_in;
        p.store_lanes = store_lanes;
        p.release_every = release_every;
        // The ring: what was asked for, at most what shared memory holds; the in-flight store
        // groups: at most what that ring leaves room for (launch_copy_ceiling rejects the rest).
        const int per_lane = std::max(1, (fan_in ? k : 1) * std::max(1, store_lanes));
        p.stages = std::min(stages, copy_ceiling_max_stages(row_bytes));
        p.in_flight = std::clamp(std::min(in_flight, p.stages / per_lane - release_every), 0, 7);
        launch_copy_ceiling(p, blocks, reinterpret_cast<cudaStream_t>(stream));
        return py::make_tuple(p.stages, p.in_flight);
      },
      py::arg("src"), py::arg("dst"), py::arg("rows"), py::arg("row_bytes"), py::arg("k"),
      py::arg("fan_in"), py::arg("blocks"), py::arg("stages"), py::arg("stream"),
      py::arg("in_flight") = 2, py::arg("store_lanes") = 1, py::arg("release_every") = 1,
      py::arg("copy_dst") = std::vector<uintptr_t>{},
      "Launches the TMA copy-ceiling kernel (copy_ceiling.h) on `stream` and returns "
      "(stages, in_flight) as used: stages clamped to shared memory, in_flight to what the ring "
      "leaves room for. fan_in=False: src [rows, row_bytes] -> dst [k * rows, row_bytes], each "
      "row stored k times; fan_in=True: src [k * rows, row_bytes] -> dst [rows, row_bytes], k "
      "rows loaded per row stored; copy_dst (fan-out, k addresses) sends copy j to copy_dst[j] + "
      "row * row_bytes instead. store_lanes (1-4) threads issue the stores, each waiting for "
      "its stores' shared-memory reads every release_every groups. Asynchronous; time it with "
      "CUDA events.");
  m.def(
      "gpu_time_ns",
      [](uintptr_t stream) { return gpu_time_ns(reinterpret_cast<cudaStream_t>(stream)); },
      py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
      "The GPU's global timer (ns), read on `stream`, which it synchronises.");
  m.def(
      "start_gate",
      [](uint64_t target_ns, uintptr_t stream) {
        launch_start_gate(target_ns, reinterpret_cast<cudaStream_t>(stream));
      },
      py::arg("target_ns"), py::arg("stream"),
      "Holds `stream` until the GPU's global timer reaches target_ns (start_gate.h).");
}
