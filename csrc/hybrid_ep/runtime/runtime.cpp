#include "hybrid_ep/runtime/runtime.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/device_info.h"
#include "hybrid_ep/kernels/common/smem_plan.h"
#include "hybrid_ep/transport/transport_hooks.h"

namespace hybrid_ep {
namespace {

// Ring depth: what the config asks for, at least `minimum`, at most what shared memory holds
// next to `reserved` bytes of other state.
int ring_stages(int wanted, int minimum, size_t stage_bytes, size_t reserved, int smem_limit) {
  const int fit = stages_that_fit(smem_limit, stage_bytes, reserved);
  if (fit < minimum) {
    throw std::invalid_argument("ring stages of " + std::to_string(stage_bytes) + " bytes: only " +
                                std::to_string(fit) + " fit in shared memory, " +
                                std::to_string(minimum) +
                                " are needed (rows too wide for this GPU, or more sources -- "
                                "ranks of a domain, or domains in the combine's final pass -- "
                                "than its shared memory holds a stage each)");
  }
  return std::clamp(wanted, minimum, fit);
}

// What the kernels can index, checked before anything is allocated (and again on growth). The
// per-token destination masks hold one domain's ranks in 64 bits; the all-gather waits for each
// domain on a thread of one block; row numbers of the received rows (W x T) and the permute's
// row sources (W x T x E) are 32-bit; the permute layout's shared memory holds 8 bytes per
// local expert without an opt-in.
void check_group_limits(const RuntimeConfig& c) {
  constexpr int64_t kInt32 = INT32_MAX;
  const int64_t rows = int64_t(c.world) * c.max_tokens;
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument(what + " (the CUDA engine's limits, docs/engine.md)");
  };
  if (c.ranks > 64) fail("ranks per NVLink domain " + std::to_string(c.ranks) + " > 64");
  if (c.nodes > 1024) fail("NVLink domains " + std::to_string(c.nodes) + " > 1024");
  if (rows > kInt32) {
    fail("group size x max_num_of_tokens_per_rank = " + std::to_string(rows) + " > 2^31 - 1");
  }
  if (rows * c.experts_per_rank > kInt32) {
    fail("group size x max_num_of_tokens_per_rank x experts per rank = " +
         std::to_string(rows * c.experts_per_rank) + " > 2^31 - 1");
  }
  if (c.experts_per_rank > 6144) {
    fail("experts per rank " + std::to_string(c.experts_per_rank) + " > 6144");
  }
}

}  // namespace

BufferShape shape_of(const RuntimeConfig& config) {
  const int64_t worst = int64_t(config.world) * config.max_tokens;
  const int64_t received = config.max_received > 0 ? std::min(config.max_received, worst) : worst;
  const int64_t row_bytes = int64_t(config.hidden) * 2;
  const int64_t chunks =
      (int64_t(config.max_tokens) + config.dispatch_chunk - 1) / std::max(1, config.dispatch_chunk);
  return BufferShape{config.world,
                     config.ranks,
                     config.experts_per_rank,
                     config.max_tokens,
                     row_bytes,
                     config.hidden / 128,
                     config.dispatch_chunk,
                     config.combine_wire_fp32 ? 4 : 2,
                     net_ring_chunks_for(config.net_ring_chunks, config.nodes,
                                         config.dispatch_chunk, chunks, row_bytes),
                     received,
                     config.zero_copy_pool_bytes,
                     config.eager && config.nodes > 1,
                     config.eager && config.nodes > 1 &&
                         (TransportHost::kRegisteredSources || config.unmapped_peers)};
}

Runtime::Runtime(const RuntimeConfig& config) : config_(config) {
  if (config_.world != config_.ranks * config_.nodes) {
    throw std::invalid_argument("world must equal ranks per domain x domains");
  }
  check_group_limits(config_);
  shape_ = shape_of(config_);
  layout_ = BufferLayout::make(shape_);
  std::map<std::string, std::string> options = config_.transport_options;
  if (config_.unmapped_peers) options["peers"] = "unmapped";  // the p2p backend's test option
  TransportSetup setup{
      nullptr, config_.nodes, config_.node_rank,  config_.channels,
      options, config_.ranks, config_.local_rank, uint64_t(config_.timeout_s * 1e9)};
  buffer_ = make_registered_buffer(setup, layout_.total,
                                   config_.fabric ? HandleKind::kFabric : HandleKind::kCudaIpc);
  // A NIC reads the eager form's staged slots: the seed's ordering precondition.
  if (shape_.eager_staged) buffer_->synchronize_memops();
  setup.registered = buffer_.get();
  if (shape_.zero_copy_pool_bytes > 0) {
    pool_ = std::make_shared<PoolArena>(buffer_, buffer_->local() + layout_.zero_copy_pool,
                                        size_t(shape_.zero_copy_pool_bytes));
  }
  transport_ = std::make_unique<TransportHost>(setup);
  const size_t counters = layout_.flags_end - layout_.flags_begin;
  HYBRID_EP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&expected_), counters));
  HYBRID_EP_CUDA_CHECK(cudaMemset(expected_, 0, counters));
  HYBRID_EP_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&dest_masks_), sizeof(uint64_t) * shape_.max_rows()));
  HYBRID_EP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&abort_), sizeof(uint32_t)));
  HYBRID_EP_CUDA_CHECK(cudaMemset(abort_, 0, sizeof(uint32_t)));
  HYBRID_EP_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&status_), sizeof(DeviceStatus), cudaHostAllocMapped));
  *status_ = DeviceStatus{};
  HYBRID_EP_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_summary_),
                                     sizeof(PreprocessSummary), cudaHostAllocMapped));
  *host_summary_ = PreprocessSummary{};
  // Device addresses of the host-mapped words, looked up once instead of per operation.
  HYBRID_EP_CUDA_CHECK(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_status_), status_, 0));
  HYBRID_EP_CUDA_CHECK(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_summary_), host_summary_, 0));
  smem_limit_ = max_shared_memory_per_block();
  sm_count_ = multiprocessor_count();
  HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
}

Runtime::~Runtime() {
  // Nothing of ours may still run when the memory goes away.
  cudaDeviceSynchronize();
  // The transport uses the buffer (registrations, mappings): it goes first.
  transport_.reset();
  pool_.reset();  // the buffer stays while blocks of its pool are alive
  buffer_.reset();
  cudaFree(expected_);
  cudaFree(dest_masks_);
  cudaFree(control_counters_);
  cudaFree(abort_);
  cudaFreeHost(status_);
  cudaFreeHost(host_summary_);
}

void Runtime::release() {
  cudaDeviceSynchronize();
  transport_.reset();
  transport_connected_ = false;
  connected_ = false;
  // With blocks of the pool still alive the buffer outlives this call (and a collectively
  // freed one is then leaked, see SymmetricBuffer::release_collectively).
  if (buffer_ && (!pool_ || pool_->stats().blocks == 0)) buffer_->release_collectively();
  pool_.reset();
  buffer_.reset();
}

size_t Runtime::registered_bytes(const RuntimeConfig& config) {
  return BufferLayout::make(shape_of(config)).total;
}

void Runtime::open_peers(const std::vector<std::string>& handles) {
  if (int(handles.size()) != config_.ranks) {
    throw std::invalid_argument("open_peers: expected " + std::to_string(config_.ranks) +
                                " handles (one per local rank), got " +
                                std::to_string(handles.size()));
  }
  buffer_->open_peers(handles, config_.local_rank);
  // Built once: every launch of every operation passes this view.
  domain_ = DomainView{};
  domain_.peers = buffer_->peer_table();
  domain_.ranks = config_.ranks;
  domain_.local_rank = config_.local_rank;
  domain_.node_rank = config_.node_rank;
  domain_.nodes = config_.nodes;
  domain_.world = config_.world;
  domain_.expected = expected_;
  domain_.flags_begin = layout_.flags_begin;
  domain_.status = device_status_;
  domain_.abort = abort_;
  domain_.timeout_ns = uint64_t(config_.timeout_s * 1e9);
  connected_ = true;
}

bool Runtime::needs_registered_sources() const {
  return config_.stage_network_sources || config_.unmapped_peers ||
         hybrid_ep::needs_registered_sources(*transport_);
}

void Runtime::connect_transport(const std::vector<std::string>& blobs) {
  transport_->connect(blobs);
  transport_context_ = transport_->context();
  if (control_counters_ == nullptr) control_counters_ = allocate_counters(config_.channels);
  control_context_ = transport_context_;
  control_context_.counters = control_counters_;  // the contract names this field
  transport_connected_ = true;
}

const TransportContext& Runtime::control_transport() const {
  transport();  // throws when not connected
  return control_context_;
}

BarrierParams Runtime::barrier() const {
  const FlagTables flags = layout_.flag_tables(shape_);
  return BarrierParams{domain(),          control_transport(),    flags.barrier,
                       flags.net_barrier, layout_.barrier_stamps, layout_.net_barrier_stamps};
}

const TransportContext& Runtime::transport() const {
  if (!transport_connected_) throw std::logic_error("Runtime: transport is not connected yet");
  return transport_context_;
}

const DomainView& Runtime::domain() const {
  if (!connected_) throw std::logic_error("Runtime: peers are not opened yet");
  return domain_;
}

int Runtime::handle_tokens(int tokens) const {
  if (tokens < 1 || tokens > config_.max_tokens) {
    throw std::invalid_argument(
        "handle: made for " + std::to_string(tokens) + " tokens per rank, but this buffer holds " +
        std::to_string(config_.max_tokens) + " (a handle of another buffer?)");
  }
  return tokens;
}

int Runtime::dispatch_stages(size_t stage_bytes) const {
  return ring_stages(config_.stages_dispatch, dispatch_min_stages(), stage_bytes,
                     dispatch_reserved_smem(config_.dispatch_chunk, config_.ranks), smem_limit_);
}

int Runtime::combine_stages(size_t stage) const {
  // A piece's copies (up to one per source: local rank, or domain in the final pass) must fit
  // at once, plus room to prefetch.
  const int width = combine_width();
  return ring_stages(
      std::max(config_.stages_combine, width + 1), width, stage,
      combine_reserved_smem(combine_chunk(), config_.ranks, config_.nodes, shape_.eager),
      smem_limit_);
}

bool Runtime::combine_fits(size_t stage) const {
  const int fit = stages_that_fit(
      smem_limit_, stage,
      combine_reserved_smem(combine_chunk(), config_.ranks, config_.nodes, shape_.eager));
  return fit >= combine_width() + 1;
}

}  // namespace hybrid_ep
