#include "wire_model.h"

#include <cuda_runtime_api.h>

#include <stdexcept>

#include "hybrid_ep/common/cuda_check.h"

namespace hybrid_ep {
namespace {

uint64_t number(const std::map<std::string, std::string>& options, const std::string& key,
                uint64_t minimum) {
  const std::string& text = options.at(key);
  size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < minimum) {
    throw std::invalid_argument("p2p transport: option " + key + "='" + text +
                                "', expected an integer >= " + std::to_string(minimum));
  }
  return value;
}

}  // namespace

WireModel wire_model_from_options(const std::map<std::string, std::string>& options) {
  WireModel wire;
  if (options.find("wire_fs_per_byte") == options.end()) return wire;
  wire.enabled = true;
  wire.fs_per_byte = number(options, "wire_fs_per_byte", 1);
  wire.op_ns = number(options, "wire_op_ns", 0);
  wire.latency_ns = number(options, "wire_latency_ns", 0);
  wire.rails = int(number(options, "wire_rails", 1));
  if (options.find("wire_fence_ns") != options.end()) {
    wire.fence_ns = number(options, "wire_fence_ns", 0);
  }
  if (wire.rails > 64) {
    throw std::invalid_argument("p2p transport: option wire_rails='" + options.at("wire_rails") +
                                "', expected at most 64");
  }
  return wire;
}

void allocate_wire_state(WireModel& wire) {
  if (!wire.enabled) return;
  const size_t bytes = sizeof(unsigned long long) * wire.rails;
  HYBRID_EP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&wire.rail_free), bytes));
  HYBRID_EP_CUDA_CHECK(cudaMemset(wire.rail_free, 0, bytes));
}

void free_wire_state(WireModel& wire) noexcept {
  if (wire.rail_free != nullptr) cudaFree(wire.rail_free);
  wire.rail_free = nullptr;
}

}  // namespace hybrid_ep
