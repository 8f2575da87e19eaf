#include "doca_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "hybrid_ep/transport/transport_error.h"

namespace hybrid_ep::doca {
namespace {

constexpr const char* kLibDirVariable = "HYBRID_EP_DOCA_LIB_DIR";

struct Candidates {
  const char* what;                // the library, as the error names it
  std::vector<std::string> names;  // file names, most specific first
  std::vector<std::string> extra;  // default install folders searched after the loader path
  const char* provides;            // how to install it
};

std::string lib_dir() {
  const char* value = std::getenv(kLibDirVariable);
  return value != nullptr ? std::string(value) : std::string();
}

// dlopen by folder first (HYBRID_EP_DOCA_LIB_DIR), then by plain name (LD_LIBRARY_PATH and the
// loader cache), then in the library's usual install folders. RTLD_GLOBAL: the DOCA library's
// own dependency on libibverbs/libmlx5 must resolve to the copies loaded here.
void* open_first(const Candidates& c, std::string& loaded_from) {
  const std::string dir = lib_dir();
  std::vector<std::string> paths;
  if (!dir.empty()) {
    for (const std::string& name : c.names) paths.push_back(dir + "/" + name);
  }
  for (const std::string& name : c.names) paths.push_back(name);
  for (const std::string& folder : c.extra) {
    for (const std::string& name : c.names) paths.push_back(folder + "/" + name);
  }
  std::string last_error;
  for (const std::string& path : paths) {
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      loaded_from = path;
      return handle;
    }
    const char* error = dlerror();
    last_error = error != nullptr ? error : "unknown dlopen error";
  }
  std::string tried;
  for (const std::string& name : c.names) tried += (tried.empty() ? "" : ", ") + name;
  throw TransportUnavailable(
      std::string("doca transport: cannot load ") + c.what + " (tried " + tried + " in " +
      kLibDirVariable + "=" + (dir.empty() ? "<unset>" : dir) +
      ", the loader's path (LD_LIBRARY_PATH) and the usual install folders; last dlopen error: " +
      last_error + "). " + c.provides + ", then set " + kLibDirVariable +
      " to the folder that holds it (or add that folder to LD_LIBRARY_PATH).");
}

template <typename Fn>
void bind(Fn& fn, void* handle, const char* symbol, const std::string& file, bool required = true) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (fn == nullptr && required) {
    throw TransportUnavailable("doca transport: " + file + " has no symbol " + symbol +
                               " (too old a library; see HYBRID_EP_DOCA_LIB_DIR in README.md)");
  }
}

std::unique_ptr<Library> load() {
  auto lib = std::make_unique<Library>();
  std::string verbs_file, mlx5_file, doca_file;
  void* verbs = open_first(
      {"libibverbs (rdma-core)",
       {"libibverbs.so.1"},
       {},
       "Install rdma-core's libibverbs1 and ibverbs-providers, or MLNX_OFED / DOCA-OFED"},
      verbs_file);
  void* mlx5 = open_first({"libmlx5 (rdma-core's mlx5 provider, for ConnectX NICs)",
                           {"libmlx5.so.1"},
                           {},
                           "Install rdma-core's ibverbs-providers, or MLNX_OFED / DOCA-OFED"},
                          mlx5_file);
  // The open-source GPUNetIO host library of the headers this build used; the DOCA SDK ships
  // it under the older name.
  void* doca = open_first(
      {"the DOCA GPUNetIO host library",
       {"libdoca_gpunetio_host.so." + std::to_string(DOCA_GPUNETIO_VERSION_MAJOR),
        "libdoca_gpunetio_host.so", "libdoca_gpunetio.so"},
       {"/usr/local/gpunetio/lib", "/opt/mellanox/doca/lib/x86_64-linux-gnu"},
       "Build and install DOCA GPUNetIO (NVIDIA-DOCA/gpunetio: make install PREFIX=...) or the "
       "DOCA SDK (doca-sdk-gpunetio)"},
      doca_file);

  Library& l = *lib;
  bind(l.get_device_list, verbs, "ibv_get_device_list", verbs_file);
  bind(l.free_device_list, verbs, "ibv_free_device_list", verbs_file);
  bind(l.get_device_name, verbs, "ibv_get_device_name", verbs_file);
  bind(l.open_device, verbs, "ibv_open_device", verbs_file);
  bind(l.close_device, verbs, "ibv_close_device", verbs_file);
  bind(l.alloc_pd, verbs, "ibv_alloc_pd", verbs_file);
  bind(l.dealloc_pd, verbs, "ibv_dealloc_pd", verbs_file);
  bind(l.query_port, verbs, "ibv_query_port", verbs_file);
  bind(l.query_gid, verbs, "ibv_query_gid", verbs_file);
  bind(l.reg_mr, verbs, "ibv_reg_mr", verbs_file);
  bind(l.reg_dmabuf_mr, verbs, "ibv_reg_dmabuf_mr", verbs_file, /*required=*/false);
  bind(l.dereg_mr, verbs, "ibv_dereg_mr", verbs_file);
  bind(l.mlx5_is_supported, mlx5, "mlx5dv_is_supported", mlx5_file);

  bind(l.get_library_version, doca, "doca_gpu_verbs_get_library_version", doca_file);
  bind(l.check_device_code, doca, "doca_gpu_verbs_check_device_code_compatibility", doca_file);
  bind(l.check_host_code, doca, "doca_gpu_verbs_check_host_code_compatibility", doca_file);
  bind(l.gpu_create, doca, "doca_gpu_create", doca_file);
  bind(l.gpu_destroy, doca, "doca_gpu_destroy", doca_file);
  bind(l.get_dmabuf_fd, doca, "doca_gpu_get_dmabuf_fd", doca_file);
  bind(l.dev_open, doca, "doca_verbs_dev_open", doca_file);
  bind(l.dev_close, doca, "doca_verbs_dev_close", doca_file);
  bind(l.query_device, doca, "doca_verbs_query_device", doca_file);
  bind(l.max_qp_wr, doca, "doca_verbs_device_attr_get_max_qp_wr", doca_file);
  bind(l.device_attr_free, doca, "doca_verbs_device_attr_free", doca_file);
  bind(l.create_qp, doca, "doca_gpu_verbs_create_qp_hl", doca_file);
  bind(l.destroy_qp, doca, "doca_gpu_verbs_destroy_qp_hl", doca_file);
  bind(l.qp_dev, doca, "doca_gpu_verbs_get_qp_dev", doca_file);
  bind(l.proxy_progress, doca, "doca_gpu_verbs_cpu_proxy_progress", doca_file);
  bind(l.query_last_error, doca, "doca_gpu_verbs_query_last_error", doca_file);
  bind(l.qp_number, doca, "doca_verbs_qp_get_qpn", doca_file);
  bind(l.qp_modify, doca, "doca_verbs_qp_modify", doca_file);
  bind(l.qp_attr_create, doca, "doca_verbs_qp_attr_create", doca_file);
  bind(l.qp_attr_destroy, doca, "doca_verbs_qp_attr_destroy", doca_file);
  bind(l.set_next_state, doca, "doca_verbs_qp_attr_set_next_state", doca_file);
  bind(l.set_remote_write, doca, "doca_verbs_qp_attr_set_allow_remote_write", doca_file);
  bind(l.set_remote_read, doca, "doca_verbs_qp_attr_set_allow_remote_read", doca_file);
  bind(l.set_atomic_mode, doca, "doca_verbs_qp_attr_set_atomic_mode", doca_file);
  bind(l.set_pkey_index, doca, "doca_verbs_qp_attr_set_pkey_index", doca_file);
  bind(l.set_port_num, doca, "doca_verbs_qp_attr_set_port_num", doca_file);
  bind(l.set_path_mtu, doca, "doca_verbs_qp_attr_set_path_mtu", doca_file);
  bind(l.set_rq_psn, doca, "doca_verbs_qp_attr_set_rq_psn", doca_file);
  bind(l.set_sq_psn, doca, "doca_verbs_qp_attr_set_sq_psn", doca_file);
  bind(l.set_dest_qp, doca, "doca_verbs_qp_attr_set_dest_qp_num", doca_file);
  bind(l.set_ah_attr, doca, "doca_verbs_qp_attr_set_ah_attr", doca_file);
  bind(l.set_min_rnr_timer, doca, "doca_verbs_qp_attr_set_min_rnr_timer", doca_file);
  bind(l.set_ack_timeout, doca, "doca_verbs_qp_attr_set_ack_timeout", doca_file);
  bind(l.set_retry_cnt, doca, "doca_verbs_qp_attr_set_retry_cnt", doca_file);
  bind(l.set_rnr_retry, doca, "doca_verbs_qp_attr_set_rnr_retry", doca_file);
  bind(l.set_max_rd_atomic, doca, "doca_verbs_qp_attr_set_max_rd_atomic", doca_file);
  bind(l.set_max_dest_rd_atomic, doca, "doca_verbs_qp_attr_set_max_dest_rd_atomic", doca_file);
  bind(l.ah_create, doca, "doca_verbs_ah_attr_create", doca_file);
  bind(l.ah_destroy, doca, "doca_verbs_ah_attr_destroy", doca_file);
  bind(l.ah_set_gid, doca, "doca_verbs_ah_attr_set_gid", doca_file);
  bind(l.ah_set_addr_type, doca, "doca_verbs_ah_attr_set_addr_type", doca_file);
  bind(l.ah_set_dlid, doca, "doca_verbs_ah_attr_set_dlid", doca_file);
  bind(l.ah_set_sl, doca, "doca_verbs_ah_attr_set_sl", doca_file);
  bind(l.ah_set_sgid_index, doca, "doca_verbs_ah_attr_set_sgid_index", doca_file);
  bind(l.ah_set_hop_limit, doca, "doca_verbs_ah_attr_set_hop_limit", doca_file);
  bind(l.ah_set_traffic_class, doca, "doca_verbs_ah_attr_set_traffic_class", doca_file);

  // The device code was compiled from the headers of DOCA_GPUNETIO_VERSION; the library must
  // accept both it and our host calls.
  uint32_t version = 0;
  l.get_library_version(&version);
  const std::string found = std::to_string(version >> 16) + "." +
                            std::to_string((version >> 8) & 0xff) + "." +
                            std::to_string(version & 0xff);
  if (l.check_device_code(DOCA_GPUNETIO_DEVICE_CODE_VERSION) != DOCA_SUCCESS ||
      l.check_host_code(DOCA_GPUNETIO_HOST_CODE_VERSION) != DOCA_SUCCESS) {
    throw TransportUnavailable("doca transport: " + doca_file + " is version " + found +
                               ", which does not accept code built against DOCA GPUNetIO " +
                               std::to_string(DOCA_GPUNETIO_VERSION_MAJOR) + "." +
                               std::to_string(DOCA_GPUNETIO_VERSION_MINOR) +
                               "; point HYBRID_EP_DOCA_LIB_DIR at a "
                               "matching library or rebuild against its headers (DOCA_HOME)");
  }
  l.description = doca_file + " (DOCA GPUNetIO " + found + "), " + verbs_file + ", " + mlx5_file;
  return lib;
}

}  // namespace

const Library& library() {
  // Loaded once it succeeds; a failure is not remembered, so a corrected environment (the
  // variable set, a library installed) works on the next attempt in the same process.
  static std::mutex mutex;
  static std::unique_ptr<Library> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) loaded = load();
  return *loaded;
}

void check(doca_error_t status, const char* what) {
  if (status != DOCA_SUCCESS) {
    throw std::runtime_error(std::string("doca transport: ") + what + " failed: DOCA error " +
                             std::to_string(int(status)));
  }
}

}  // namespace hybrid_ep::doca
