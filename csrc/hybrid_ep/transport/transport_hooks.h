// The optional members of the transport contract (transport.h), resolved at compile time: the
// backend's own when it declares them, else the default every other backend shares. So the
// runtime and the bindings call these and still name no backend.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "hybrid_ep/memory/symmetric_buffer.h"
#include "hybrid_ep/transport/transport.h"

namespace hybrid_ep {
namespace hooks {

template <typename T, typename = void>
struct HasMakeRegistered : std::false_type {};
template <typename T>
struct HasMakeRegistered<T, std::void_t<decltype(T::make_registered(
                                std::declval<const TransportSetup&>(), size_t(), HandleKind()))>>
    : std::true_type {};

template <typename T, typename = void>
struct HasUniqueId : std::false_type {};
template <typename T>
struct HasUniqueId<T, std::void_t<decltype(T::unique_id())>> : std::true_type {};

template <typename T, typename = void>
struct HasDescribeFailure : std::false_type {};
template <typename T>
struct HasDescribeFailure<T,
                          std::void_t<decltype(T::describe_failure(std::string(), int(), int()))>>
    : std::true_type {};

template <typename T, typename = void>
struct HasVersionMismatch : std::false_type {};
template <typename T>
struct HasVersionMismatch<
    T, std::void_t<decltype(T::version_mismatch(int(), int(), int(), int(), int(), int()))>>
    : std::true_type {};

}  // namespace hooks

// The registered buffer of `bytes` for this build's transport; `setup.registered` is ignored.
inline std::unique_ptr<SymmetricBuffer> make_registered_buffer(const TransportSetup& setup,
                                                               size_t bytes, HandleKind kind) {
  if constexpr (hooks::HasMakeRegistered<TransportHost>::value) {
    return TransportHost::make_registered(setup, bytes, kind);
  } else {
    (void)setup;
    return std::make_unique<SymmetricBuffer>(bytes, kind);
  }
}

// The group-wide id this build's transport needs before its runtimes are built; empty if none.
inline std::string transport_unique_id() {
  if constexpr (hooks::HasUniqueId<TransportHost>::value) {
    return TransportHost::unique_id();
  } else {
    return std::string();
  }
}

}  // namespace hybrid_ep
