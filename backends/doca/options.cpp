#include "options.h"

#include <sstream>
#include <stdexcept>

namespace hybrid_ep::doca {
namespace {

const std::string& required(const std::map<std::string, std::string>& options,
                            const std::string& key) {
  auto it = options.find(key);
  if (it == options.end() || it->second.empty()) {
    throw std::invalid_argument(
        "doca transport: option '" + key +
        "' is missing; HybridEPBuffer fills "
        "RuntimeConfig.transport_options (hybrid_ep.transport_options.runtime_options), a "
        "direct hybrid_ep._C.Runtime user must too");
  }
  return it->second;
}

int to_int(const std::string& key, const std::string& text, int low, int high) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < low || value > high) {
    throw std::invalid_argument("doca transport: option " + key + "='" + text +
                                "' is not an integer in [" + std::to_string(low) + ", " +
                                std::to_string(high) + "]");
  }
  return value;
}

}  // namespace

Options parse_options(const std::map<std::string, std::string>& options) {
  Options parsed;
  std::stringstream entries(required(options, "nics"));
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    const size_t first = entry.find(':');
    const size_t second = entry.find(':', first == std::string::npos ? first : first + 1);
    if (first == std::string::npos || second == std::string::npos || first == 0) {
      throw std::invalid_argument("doca transport: option nics entry '" + entry +
                                  "' is not name:port:gid_index");
    }
    NicChoice nic;
    nic.name = entry.substr(0, first);
    nic.port = to_int("nics port", entry.substr(first + 1, second - first - 1), 1, 255);
    nic.gid_index = to_int("nics gid_index", entry.substr(second + 1), 0, 255);
    parsed.nics.push_back(nic);
  }
  if (parsed.nics.empty()) throw std::invalid_argument("doca transport: option nics is empty");
  parsed.traffic_class = to_int("traffic_class", required(options, "traffic_class"), 0, 255);
  parsed.qp_depth = to_int("qp_depth", required(options, "qp_depth"), 1, 32768);
  if (parsed.qp_depth & (parsed.qp_depth - 1)) {
    throw std::invalid_argument("doca transport: option qp_depth=" +
                                std::to_string(parsed.qp_depth) + " is not a power of two");
  }
  return parsed;
}

}  // namespace hybrid_ep::doca
