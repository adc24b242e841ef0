#pragma once
// The CUDA device's link to the other ranks' GPUs: NCCL communicators bootstrapped through the ranks' MPI
// communicator (rank 0 makes the ncclUniqueId and sends it to every rank), one for all ranks and one per group the
// step reduces over (ncclCommSplit), so every sub-communicator exists before the step, as with MPI.
//
// Never a hang: the communicators are non-blocking (ncclConfig_t::blocking = 0), every NCCL call is polled with
// ncclCommGetAsyncError to a deadline and Ctrl-C, and wait() bounds the GPU's wait for the queued collectives the
// same way; on a timeout, an NCCL error or Ctrl-C every communicator is aborted (ncclCommAbort) and a CommError
// names the rank, the group and the call with file:line.
//
// NOT YET RUN ON A GPU: no GPU was lent while this was written. It compiles warning-free; `mpirun -np N trainyard
// run --device gpu` reaches it (data-parallel plans), and scripts/gpu_check.sh runs that where a node has GPUs.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/communicator.hpp"
#include "backend/device.hpp"

namespace trainyard::backend {

class NcclPeers {
 public:
  // Collective over `bootstrap`'s ranks (each on its own GPU, already the current device): the world's
  // communicator, then one per entry of `groups` (sorted ranks) in that order.
  NcclPeers(Communicator& bootstrap, const std::vector<std::vector<int>>& groups, std::chrono::milliseconds timeout);
  ~NcclPeers();
  NcclPeers(const NcclPeers&) = delete;
  NcclPeers& operator=(const NcclPeers&) = delete;

  // Queues an in-place sum of `n` floats of device memory over `group` (one of the groups given, or every rank).
  void all_reduce_sum(const std::vector<int>& group, float* data, std::int64_t n, cudaStream_t stream);
  // The same on `n` bf16 values (tensor parallelism's activations), summed by NCCL in bf16 as Megatron's are.
  void all_reduce_sum_bf16(const std::vector<int>& group, std::uint16_t* data, std::int64_t n, cudaStream_t stream);
  // Queues `bytes` of device memory to or from world rank `peer` (NCCL matches a peer's sends and receives in order).
  void send(int peer, const void* data, std::int64_t bytes, cudaStream_t stream);
  void recv(int peer, void* data, std::int64_t bytes, cudaStream_t stream);
  // Queues sends[i] to and recvs[i] from world rank ranks[i] as one group (ncclGroupStart/End, so no send waits
  // on a receive queued after it); this rank's own block is a device-to-device copy.
  void all_to_all(const std::vector<int>& ranks, const std::vector<ConstBytes>& sends, const std::vector<Bytes>& recvs, cudaStream_t stream);
  // Waits for `streams` to finish what they hold, bounded as every NCCL call is.
  void wait(const std::vector<cudaStream_t>& streams);

 private:
  void all_reduce(const std::vector<int>& group, void* data, std::int64_t n, bool bf16, cudaStream_t stream);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::backend
