// hybrid_ep._C.buffer_layout: the bytes of every region of the registered buffer a Runtime of a
// config would allocate, laid out by BufferLayout::make (the runtime's own code), with no GPU.
// hybrid_ep.memory_plan is its Python face.
#include "hybrid_ep/bindings/layout.h"

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "hybrid_ep/memory/layout.h"
#include "hybrid_ep/runtime/runtime.h"

namespace py = pybind11;

namespace hybrid_ep {
namespace {

py::dict buffer_layout(int64_t world, int64_t ranks, int64_t experts_per_rank, int64_t max_tokens,
                       int64_t hidden, int64_t dispatch_chunk, bool combine_wire_fp32,
                       int64_t net_ring_chunks) {
  // The Python layer names the argument; these only keep make() from dividing by zero.
  if (world < 1 || ranks < 1 || experts_per_rank < 1 || max_tokens < 1 || hidden < 1 ||
      dispatch_chunk < 1 || net_ring_chunks < 0) {
    throw std::invalid_argument("buffer_layout: every count must be >= 1 (net_ring_chunks >= 0)");
  }
  if (world % ranks != 0) {
    throw std::invalid_argument("buffer_layout: ranks must divide world");
  }
  const int64_t most = std::numeric_limits<int>::max();
  if (world > most || experts_per_rank > most || max_tokens > most || hidden > most ||
      dispatch_chunk > most || net_ring_chunks > most) {
    throw std::invalid_argument("buffer_layout: every count must fit a 32-bit int");
  }
  RuntimeConfig config;
  config.world = int(world);
  config.ranks = int(ranks);
  config.nodes = int(world / ranks);
  config.experts_per_rank = int(experts_per_rank);
  config.max_tokens = int(max_tokens);
  config.hidden = int(hidden);
  config.dispatch_chunk = int(dispatch_chunk);
  config.combine_wire_fp32 = combine_wire_fp32;
  config.net_ring_chunks = int(net_ring_chunks);
  const BufferShape shape = shape_of(config);
  const BufferLayout layout = BufferLayout::make(shape);
  py::dict out;
  BufferLayout::for_each_region(
      shape, [&](const char* name, size_t BufferLayout::*, size_t bytes) { out[name] = bytes; });
  out["total"] = layout.total;
  out["net_ring_chunks"] = shape.net_ring_chunks;
  return out;
}

}  // namespace

void register_layout(py::module_& m) {
  m.def("buffer_layout", &buffer_layout, py::arg("world"), py::arg("ranks"),
        py::arg("experts_per_rank"), py::arg("max_tokens"), py::arg("hidden"),
        py::arg("dispatch_chunk"), py::arg("combine_wire_fp32"), py::arg("net_ring_chunks") = 0,
        "Bytes of each region of the registered buffer a Runtime of this config allocates, in "
        "layout order (without alignment padding), and 'total' (Runtime.bytes_for, with it).");
}

}  // namespace hybrid_ep
