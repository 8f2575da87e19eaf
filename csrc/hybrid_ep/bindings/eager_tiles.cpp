// hybrid_ep._C.eager_tiles and eager_signal_value: the eager form's tile layout
// (memory/eager_tiles.h) computed by the kernels' own functions, with no GPU.
#include "hybrid_ep/bindings/eager_tiles.h"

#include <cstdint>
#include <stdexcept>

#include "hybrid_ep/memory/eager_tiles.h"

namespace py = pybind11;

namespace hybrid_ep {
namespace {

py::dict eager_tiles(int64_t rows, int64_t row_bytes, int64_t prob_bytes, int64_t scale_bytes) {
  if (rows < 0 || row_bytes < 1 || prob_bytes < 0 || scale_bytes < 0) {
    throw std::invalid_argument("eager_tiles: rows >= 0, row_bytes >= 1, the others >= 0");
  }
  const EagerPayload p = EagerPayload::make(rows, row_bytes, prob_bytes, scale_bytes);
  const int64_t bytes = p.bytes();
  py::list tiles, row_tiles;
  for (int64_t t = 0; t < EagerTiles::count(bytes); ++t) {
    tiles.append(py::make_tuple(EagerTiles::data_bytes(bytes, t),
                                EagerTiles::signal_offset(bytes, t),
                                EagerTiles::tile_wire_bytes(bytes, t)));
  }
  py::list data_at;  // where each row's data lands in the slot, piece by piece
  for (int64_t r = 0; r < rows; ++r) {
    row_tiles.append(py::make_tuple(p.first_tile_of(r), p.last_tile_of(r)));
    data_at.append(EagerTiles::wire_offset(p.row_at(r)));
  }
  py::dict d;
  d["record"] = p.record;
  d["probs_at"] = p.probs_at;
  d["scales_at"] = p.scales_at;
  d["bytes"] = bytes;
  d["wire_bytes"] = EagerTiles::wire_bytes(bytes);
  d["tiles"] = tiles;
  d["row_tiles"] = row_tiles;
  d["row_wire_offsets"] = data_at;
  return d;
}

}  // namespace

void register_eager_tiles(py::module_& m) {
  m.def("eager_tiles", &eager_tiles, py::arg("rows"), py::arg("row_bytes"),
        py::arg("prob_bytes") = 0, py::arg("scale_bytes") = 0,
        "The eager tile layout of a chunk of `rows` records (data, probs, scales): record size "
        "and part offsets, payload and wire bytes, per tile (data bytes, signal offset, wire "
        "bytes), per row its first and last tile and where its data starts in the slot.");
  m.def("eager_signal_value", &eager_signal_value, py::arg("epoch"), py::arg("sequence"),
        "The value the tile signals of chunk `sequence` of call `epoch` carry (never 0).");
  m.attr("EAGER_TILE_BYTES") = EagerTiles::kTileBytes;
  m.attr("EAGER_SIGNAL_BYTES") = EagerTiles::kSignalBytes;
}

}  // namespace hybrid_ep
