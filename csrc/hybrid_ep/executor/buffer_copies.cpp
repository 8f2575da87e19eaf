// Copies between the caller's tensors and this rank's registered buffer, shared by the steps:
// staging for network puts, the dispatch's copy-out, the combine's staging.
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/executor/executor.h"

namespace hybrid_ep {

const void* network_source(Runtime& runtime, const void* source, size_t bytes,
                           size_t registered_offset, cudaStream_t stream, size_t& staged) {
  if (!runtime.needs_registered_sources() || bytes == 0) return source;
  if (runtime.pool() && runtime.pool()->holds(source, bytes)) return source;
  uint8_t* copy = runtime.registered() + registered_offset;
  HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(copy, source, bytes, cudaMemcpyDeviceToDevice, stream));
  staged += bytes;
  return copy;
}

void RowCopies::add_outside(void* dst, const void* src, size_t row_bytes, int rows, RowRange skip) {
  if (skip.size() > 0 && (skip.begin < 0 || skip.end > rows)) {
    throw std::invalid_argument("rows [" + std::to_string(skip.begin) + ", " +
                                std::to_string(skip.end) + ") to skip lie outside the " +
                                std::to_string(rows) + " rows");
  }
  const RowRange cut = skip.size() > 0 ? skip : RowRange{rows, rows};
  for (const RowRange part : {RowRange{0, cut.begin}, RowRange{cut.end, rows}}) {
    if (part.size() == 0) continue;
    if (params_.count == kMaxCopySegments) {
      throw std::logic_error("RowCopies: more than " + std::to_string(kMaxCopySegments) +
                             " ranges in one launch");
    }
    const size_t offset = size_t(part.begin) * row_bytes;
    params_.segments[params_.count++] = {static_cast<const uint8_t*>(src) + offset,
                                         static_cast<uint8_t*>(dst) + offset,
                                         size_t(part.size()) * row_bytes};
  }
}

void RowCopies::launch(const Runtime& runtime, cudaStream_t stream) const {
  if (params_.count > 0) launch_segment_copy(params_, runtime.sm_count(), stream);
}

}  // namespace hybrid_ep
