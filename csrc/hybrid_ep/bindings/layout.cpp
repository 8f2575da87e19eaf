// hybrid_ep._C.buffer_layout: the bytes of every region of the registered buffer a Runtime of a
// config would allocate, laid out by BufferLayout::make (the runtime's own code), with no GPU.
// hybrid_ep.memory_plan is its Python face. pack_routing and routing_ranks run the gathered
// routing's format (kernels/common/routing_bits.h) on the host, so that the CPU tests check
// the kernels' own functions.
#include "hybrid_ep/bindings/layout.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "hybrid_ep/kernels/common/routing_bits.h"
#include "hybrid_ep/memory/layout.h"
#include "hybrid_ep/runtime/runtime.h"

namespace py = pybind11;

namespace hybrid_ep {
namespace {

py::dict buffer_layout(int64_t world, int64_t ranks, int64_t experts_per_rank, int64_t max_tokens,
                       int64_t hidden, int64_t dispatch_chunk, bool combine_wire_fp32,
                       int64_t net_ring_chunks, int64_t max_received, int64_t zero_copy_pool_bytes,
                       bool eager) {
  // The Python layer names the argument; these only keep make() from dividing by zero.
  if (world < 1 || ranks < 1 || experts_per_rank < 1 || max_tokens < 1 || hidden < 1 ||
      dispatch_chunk < 1 || net_ring_chunks < 0) {
    throw std::invalid_argument("buffer_layout: every count must be >= 1 (net_ring_chunks >= 0)");
  }
  if (zero_copy_pool_bytes < 0) {
    throw std::invalid_argument("buffer_layout: zero_copy_pool_bytes must be >= 0");
  }
  if (max_received < 0) {
    throw std::invalid_argument("buffer_layout: max_received must be >= 0 (0: world x tokens)");
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
  config.max_received = max_received;
  config.zero_copy_pool_bytes = zero_copy_pool_bytes;
  config.eager = eager;
  const BufferShape shape = shape_of(config);
  const BufferLayout layout = BufferLayout::make(shape);
  py::dict out;
  BufferLayout::for_each_region(
      shape, [&](const char* name, size_t BufferLayout::*, size_t bytes) { out[name] = bytes; });
  out["total"] = layout.total;
  out["net_ring_chunks"] = shape.net_ring_chunks;
  return out;
}

// Token t's words for domain n of a bool routing map [tokens, N * domain_cols], as the
// all-gather packs them: [tokens, words].
std::vector<uint32_t> pack_routing(const py::bytes& map, int64_t tokens, int domain_cols,
                                   int domain) {
  const std::string bytes = map;
  if (tokens < 1 || domain_cols < 1 || bytes.size() % (size_t(tokens) * domain_cols) != 0) {
    throw std::invalid_argument("pack_routing: the map must be tokens x (a multiple of cols)");
  }
  const int64_t row = int64_t(bytes.size()) / tokens;
  if (domain < 0 || int64_t(domain + 1) * domain_cols > row) {
    throw std::invalid_argument("pack_routing: no such domain in the map");
  }
  // 16-byte aligned, like a torch allocation, so the kernels' vector reads are the ones run.
  std::vector<uint4> aligned((bytes.size() + 15) / 16);
  auto* data = reinterpret_cast<uint8_t*>(aligned.data());
  std::copy(bytes.begin(), bytes.end(), data);
  const bool vector = routing_vector_reads(data, domain_cols);
  const int words = (domain_cols + kRoutingWordBits - 1) / kRoutingWordBits;
  std::vector<uint32_t> out;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int w = 0; w < words; ++w) {
      out.push_back(routing_word_of_row(data + t * row, domain_cols, domain, w, vector));
    }
  }
  return out;
}

uint64_t routing_ranks(const std::vector<uint32_t>& words, int experts_per_rank) {
  if (experts_per_rank < 1 || words.size() * kRoutingWordBits > size_t(64) * experts_per_rank) {
    throw std::invalid_argument("routing_ranks: at most 64 ranks of experts_per_rank >= 1");
  }
  return ranks_of_routing_words(words.data(), int(words.size()), experts_per_rank);
}

}  // namespace

void register_layout(py::module_& m) {
  m.def("buffer_layout", &buffer_layout, py::arg("world"), py::arg("ranks"),
        py::arg("experts_per_rank"), py::arg("max_tokens"), py::arg("hidden"),
        py::arg("dispatch_chunk"), py::arg("combine_wire_fp32"), py::arg("net_ring_chunks") = 0,
        py::arg("max_received") = 0, py::arg("zero_copy_pool_bytes") = 0, py::arg("eager") = false,
        "Bytes of each region of the registered buffer a Runtime of this config allocates, in "
        "layout order (without alignment padding), and 'total' (Runtime.bytes_for, with it). "
        "max_received: rows of the in-domain receive regions (0: world x max_tokens); "
        "zero_copy_pool_bytes: the zero-copy pool; eager: the rows between domains in the eager "
        "form's tiles (HYBRID_EP_EAGER).");
  m.def("pack_routing", &pack_routing, py::arg("map"), py::arg("tokens"), py::arg("domain_cols"),
        py::arg("domain"),
        "The all-gather's words [tokens * words] of domain `domain` of a bool routing map given "
        "as bytes [tokens, N * domain_cols].");
  m.def("routing_ranks", &routing_ranks, py::arg("words"), py::arg("experts_per_rank"),
        "The metadata's mask of the local ranks one token's words go to (bit j: local rank j).");
}

}  // namespace hybrid_ep
