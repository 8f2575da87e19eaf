#include "session.h"

#include <cuda_runtime_api.h>
#include <dirent.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

// The host API only: nvshmem.h would pull in the device API (and libcu++) into a g++ TU.
#include "host/nvshmem_api.h"
#include "host/nvshmemx_api.h"
#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/transport/transport_error.h"
#include "status.h"

namespace hybrid_ep::nvshmem {
namespace {

static_assert(sizeof(nvshmemx_uniqueid_t) == 128, "NVSHMEM's unique id is 128 bytes");

std::mutex& session_mutex() {
  static std::mutex m;
  return m;
}
// The live session (buffers hold it) and whether this process has run our init already.
std::weak_ptr<Session>& current() {
  static std::weak_ptr<Session> s;
  return s;
}
bool initialised_here = false;
int initialised_rank = -1, initialised_world = -1;

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// The folder libnvshmem_host.so.3 was loaded from: NVSHMEM dlopens its plugins from there.
std::string host_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvshmemx_vendor_get_version_info), &info) == 0 ||
      info.dli_fname == nullptr) {
    return std::string();
  }
  return info.dli_fname;
}

// Loads `path` and unloads it again; empty on success, else dlerror's message.
std::string try_load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return error != nullptr ? error : "unknown dlopen error";
  }
  dlclose(handle);
  return std::string();
}

// `prefix`* in `folder` (plugins carry their own ABI major, which differs between releases).
std::vector<std::string> files_starting(const std::string& folder, const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* dir = opendir(folder.c_str())) {
    while (dirent* entry = readdir(dir)) {
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) {
        out.push_back(folder + "/" + entry->d_name);
      }
    }
    closedir(dir);
  }
  return out;
}

bool env_is(const char* name, const char* value) {
  const char* set = std::getenv(name);
  return set != nullptr && std::strcmp(set, value) == 0;
}

}  // namespace

std::string preflight() {
  int major = 0, minor = 0, patch = 0;
  nvshmemx_vendor_get_version_info(&major, &minor, &patch);
  const std::string mismatch =
      version_mismatch(NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION,
                       NVSHMEM_VENDOR_PATCH_VERSION, major, minor, patch);
  const std::string library = host_library();
  if (!mismatch.empty()) {
    throw TransportUnavailable("nvshmem transport: " + mismatch + " (loaded from " +
                               (library.empty() ? "an unknown file" : library) + ")");
  }
  const std::string folder = folder_of(library);
  std::string found = "nvshmem: libnvshmem_host.so.3 " + std::to_string(major) + "." +
                      std::to_string(minor) + "." + std::to_string(patch) + " from " + library;
  const std::string uid = folder + "/nvshmem_bootstrap_uid.so.3";
  if (const std::string error = try_load(uid); !error.empty()) {
    throw TransportUnavailable(
        "nvshmem transport: NVSHMEM's unique-id bootstrap plugin does not load (" + error +
        "); it must lie beside libnvshmem_host.so.3, as the nvidia-nvshmem-cu13 wheel installs "
        "it (NVSHMEM_BOOTSTRAP_UID_PLUGIN names another file)");
  }
  found += ", bootstrap " + uid;
  if (env_is("NVSHMEM_IB_ENABLE_IBGDA", "1")) {
    const std::vector<std::string> ibgda = files_starting(folder, "nvshmem_transport_ibgda.so");
    std::string error = ibgda.empty() ? "no nvshmem_transport_ibgda.so.* in " + folder : "";
    for (const std::string& path : ibgda) {
      error = try_load(path);
      if (error.empty()) {
        found += ", IBGDA " + path;
        break;
      }
    }
    if (!error.empty()) {
      throw TransportUnavailable(
          "nvshmem transport: NVSHMEM_IB_ENABLE_IBGDA=1 but NVSHMEM's IBGDA transport plugin "
          "does not load (" +
          error + "); it needs rdma-core's libibverbs and libmlx5 (MLNX_OFED / DOCA-OFED)");
    }
  }
  return found;
}

std::string make_unique_id() {
  if (nvshmemx_init_status() >= NVSHMEM_STATUS_IS_INITIALIZED) return std::string();
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  const int status = nvshmemx_get_uniqueid(&id);
  if (status != 0) {
    throw TransportUnavailable(
        describe_failure("nvshmemx_get_uniqueid", status, nvshmemx_init_status()));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

std::shared_ptr<Session> Session::join(int rank, int world, const std::string& unique_id) {
  std::lock_guard<std::mutex> lock(session_mutex());
  if (!initialised_here) {
    preflight();
    // Init needs a current context, or it stops after the bootstrap.
    HYBRID_EP_CUDA_CHECK(cudaFree(nullptr));
    nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    unsigned int flags = 0;
    nvshmemx_init_attr_t* attributes = nullptr;
    if (!unique_id.empty()) {
      if (unique_id.size() != sizeof(id)) {
        throw TransportUnavailable("nvshmem transport: the unique id from rank 0 has " +
                                   std::to_string(unique_id.size()) + " bytes, not " +
                                   std::to_string(sizeof(id)));
      }
      std::memcpy(&id, unique_id.data(), sizeof(id));
      // Keeps a pointer to `id`, which outlives the init call below.
      const int status = nvshmemx_set_attr_uniqueid_args(rank, world, &id, &attr);
      if (status != 0) {
        throw TransportUnavailable(
            describe_failure("nvshmemx_set_attr_uniqueid_args", status, nvshmemx_init_status()));
      }
      flags = NVSHMEMX_INIT_WITH_UNIQUEID;
      attributes = &attr;
    } else if (nvshmemx_init_status() < NVSHMEM_STATUS_IS_INITIALIZED) {
      // Rank 0 sends no id when its NVSHMEM runs already (e.g. torch started it).
      throw TransportUnavailable(
          "nvshmem transport: rank 0 sent no unique id (its NVSHMEM was initialised already) "
          "but this rank's is not: every rank must start NVSHMEM the same way");
    }
    // Registers this module's device state with NVSHMEM (also when it runs already).
    int provided = 0;
    const nvshmemi_version_t built = {NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION,
                                      NVSHMEM_VENDOR_PATCH_VERSION};
    const int status =
        nvshmemi_init_thread(NVSHMEM_THREAD_SERIALIZED, &provided, flags, attributes, built);
    if (status != 0) {
      throw TransportUnavailable(
          describe_failure("nvshmemi_init_thread", status, nvshmemx_init_status()));
    }
    initialised_here = true;
    initialised_rank = nvshmem_my_pe();
    initialised_world = nvshmem_n_pes();
  }
  // nvshmem_malloc is collective over all PEs: one group per process.
  if (initialised_rank != rank || initialised_world != world) {
    throw TransportUnavailable(
        "nvshmem transport: NVSHMEM runs as PE " + std::to_string(initialised_rank) + " of " +
        std::to_string(initialised_world) + " but this buffer's group has this process as rank " +
        std::to_string(rank) + " of " + std::to_string(world) +
        ": all nvshmem buffers of a process must use one process group");
  }
  std::shared_ptr<Session> session = current().lock();
  if (!session) {
    session = std::make_shared<Session>(rank, world);
    current() = session;
  }
  return session;
}

std::shared_ptr<Session> Session::live() {
  std::lock_guard<std::mutex> lock(session_mutex());
  return current().lock();
}

uint8_t* Session::allocate(size_t bytes) const {
  void* base = nvshmem_malloc(bytes);
  if (base == nullptr) {
    throw TransportUnavailable(
        "nvshmem transport: nvshmem_malloc(" + std::to_string(bytes) +
        ") returned NULL (NVSHMEM stage " + std::to_string(nvshmemx_init_status()) +
        "): the symmetric heap cannot hold this buffer; with a static heap "
        "(NVSHMEM_DISABLE_CUDA_VMM=1) raise NVSHMEM_SYMMETRIC_SIZE above the bytes needed. "
        "Rerun with NVSHMEM_DEBUG=INFO for NVSHMEM's own log.");
  }
  return static_cast<uint8_t*>(base);
}

void Session::free(uint8_t* base) const { nvshmem_free(base); }

uint8_t* Session::mapped_address(uint8_t* base, int pe) const {
  return static_cast<uint8_t*>(nvshmem_ptr(base, pe));
}

uint8_t* Session::peer_address(uint8_t* base, int pe, const std::string& who) const {
  uint8_t* address = mapped_address(base, pe);
  if (address == nullptr) {
    throw TransportUnavailable(
        "nvshmem transport: nvshmem_ptr gives no load/store address of " + who + " (PE " +
        std::to_string(pe) +
        "): NVSHMEM does not map its heap over P2P/NVLink between these processes, which the "
        "NVLink domain needs. Rerun with NVSHMEM_DEBUG=INFO for NVSHMEM's own log.");
  }
  return address;
}

}  // namespace hybrid_ep::nvshmem
