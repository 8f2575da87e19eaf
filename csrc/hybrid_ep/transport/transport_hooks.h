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

template <typename T, typename = void>
struct HasNeedsRegisteredSources : std::false_type {};
template <typename T>
struct HasNeedsRegisteredSources<
    T, std::void_t<decltype(std::declval<const T&>().needs_registered_sources())>>
    : std::true_type {};

// The optional diagnostics as _C functions, where the backend has them. Templates, so that
// the branch a backend lacks is never instantiated (if constexpr discards only there).
template <typename Module, typename Host = TransportHost>
void bind_diagnostics(Module& m) {
  if constexpr (HasDescribeFailure<Host>::value) {
    m.def("transport_describe_failure", &Host::describe_failure,
          "The transport's message for a failed library call (call, status, init stage).");
  }
  if constexpr (HasVersionMismatch<Host>::value) {
    m.def("transport_version_mismatch", &Host::version_mismatch,
          "Why a build against one library version cannot run on another; empty if it can.");
  }
}

}  // namespace hooks

// The registered buffer of `bytes` for this build's transport; `setup.registered` is ignored.
template <typename Host = TransportHost>
std::unique_ptr<SymmetricBuffer> make_registered_buffer(const TransportSetup& setup, size_t bytes,
                                                        HandleKind kind) {
  if constexpr (hooks::HasMakeRegistered<Host>::value) {
    return Host::make_registered(setup, bytes, kind);
  } else {
    (void)setup;
    return std::make_unique<SymmetricBuffer>(bytes, kind);
  }
}

// Whether this connected transport's puts must read registered memory: the backend's answer
// (e.g. not when every peer is mapped into this process and puts are our stores), else its
// compile-time kRegisteredSources.
template <typename Host>
bool needs_registered_sources(const Host& host) {
  if constexpr (hooks::HasNeedsRegisteredSources<Host>::value) {
    return host.needs_registered_sources();
  } else {
    (void)host;
    return Host::kRegisteredSources;
  }
}

// The group-wide id this build's transport needs before its runtimes are built; empty if none.
template <typename Host = TransportHost>
std::string transport_unique_id() {
  if constexpr (hooks::HasUniqueId<Host>::value) {
    return Host::unique_id();
  } else {
    return std::string();
  }
}

}  // namespace hybrid_ep
