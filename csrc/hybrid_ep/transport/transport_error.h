// What a transport throws when something it needs at run time is missing (a shared library it
// loads, a driver feature): the message says what is missing and which variable or install
// provides it. The bindings turn it into hybrid_ep._C.TransportUnavailableError.
#pragma once

#include <stdexcept>

namespace hybrid_ep {

class TransportUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace hybrid_ep
