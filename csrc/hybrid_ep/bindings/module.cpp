// hybrid_ep._C: the Python face of the C++ core. Only conversion happens here; the logic
// lives in csrc/hybrid_ep/runtime and below.
#include <pybind11/pybind11.h>

#include "hybrid_ep/bindings/eager_tiles.h"
#include "hybrid_ep/bindings/layout.h"
#include "hybrid_ep/bindings/runtime.h"
#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/device_info.h"
#include "hybrid_ep/runtime/build_info.h"
#include "hybrid_ep/transport/transport.h"
#include "hybrid_ep/transport/transport_hooks.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "hybrid-ep C++/CUDA core";

  // Subclass of RuntimeError, so callers that catch RuntimeError keep working.
  py::register_exception<hybrid_ep::CudaError>(m, "CudaError", PyExc_RuntimeError);
  // A transport's run-time dependency is missing; the message says what and how to provide it.
  py::register_exception<hybrid_ep::TransportUnavailable>(m, "TransportUnavailableError",
                                                          PyExc_RuntimeError);

  m.def(
      "build_info",
      [] {
        const hybrid_ep::BuildInfo info = hybrid_ep::build_info();
        py::dict d;
        d["transport"] = info.transport;
        d["cuda_architectures"] = info.cuda_architectures;
        d["cuda_toolkit_version"] = info.cuda_toolkit_version;
        d["cuda_runtime_version"] = hybrid_ep::runtime_version();
        d["cuda_driver_version"] = hybrid_ep::driver_version();
        d["version"] = info.version;
        d["host_compiler"] = info.host_compiler;
        d["transport_library"] = info.transport_library;
        return d;
      },
      "How this extension was built, plus the CUDA runtime and driver versions seen now.");

  // The first CUDA call initialises the driver, which can take a while: release the GIL.
  m.def("device_count", &hybrid_ep::device_count, py::call_guard<py::gil_scoped_release>(),
        "Number of visible CUDA devices; 0 without a driver or GPU.");

  m.def("transport_preflight", &hybrid_ep::TransportHost::preflight,
        "Loads what this build's transport needs at run time, without touching the GPU; returns "
        "what was loaded, raises TransportUnavailableError naming what is missing.");

  m.def(
      "transport_unique_id", [] { return py::bytes(hybrid_ep::transport_unique_id()); },
      "Bytes the group's rank 0 makes and every rank passes to its runtime (transport option "
      "unique_id, hex) before building it; empty when this build's transport needs none.");
  // The transport's error table and library version rule, where it has them.
  hybrid_ep::hooks::bind_diagnostics(m);

  hybrid_ep::register_runtime(m);
  hybrid_ep::register_layout(m);
  hybrid_ep::register_eager_tiles(m);
}
