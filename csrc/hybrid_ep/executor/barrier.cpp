#include "hybrid_ep/executor/executor.h"

namespace hybrid_ep {

void run_barrier(Runtime& runtime, cudaStream_t stream) {
  runtime.begin_call(0);  // an internal operation: no stamp to compare
  launch_domain_barrier(runtime.barrier(), stream);
}

}  // namespace hybrid_ep
