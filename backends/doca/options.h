// The doca transport's settings as the Python layer resolved them (python/hybrid_ep/
// transport_options.py is their one source: it parses and checks the environment, picks the
// NICs and computes the queue depth). They arrive as TransportSetup::options, plain strings.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nic.h"

namespace hybrid_ep::doca {

struct Options {
  std::vector<NicChoice> nics;  // "nics": name:port:gid_index,...  channel c uses nics[c % n]
  int traffic_class = 0;        // "traffic_class": 0-255
  int qp_depth = 0;             // "qp_depth": send queue entries per QP, a power of two
};

// Throws std::invalid_argument naming the missing or malformed option.
Options parse_options(const std::map<std::string, std::string>& options);

}  // namespace hybrid_ep::doca
