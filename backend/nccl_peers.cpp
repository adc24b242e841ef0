#include "backend/nccl_peers.hpp"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <thread>

#include "common/interrupt.hpp"

namespace trainyard::backend {

struct NcclPeers::Impl {
  int rank = 0;
  std::chrono::milliseconds timeout;
  ncclComm_t world = nullptr;
  std::map<std::vector<int>, ncclComm_t> groups;  // by their sorted ranks; the world's too
  bool aborted = false;

  std::vector<ncclComm_t> all() const {
    std::vector<ncclComm_t> out;
    for (const auto& [members, comm] : groups) out.push_back(comm);
    if (world != nullptr) out.push_back(world);
    return out;
  }

  [[noreturn]] void fail(const std::string& what, const char* file, int line) {
    abort_all();
    throw CommError("rank " + std::to_string(rank) + ": " + what, file, line);
  }

  void abort_all() {
    if (aborted) return;
    aborted = true;
    for (ncclComm_t c : all()) ncclCommAbort(c);
    groups.clear();
    world = nullptr;
  }

  // A non-blocking communicator's call returns before it is done: poll until it is, to the deadline.
  void settle(ncclComm_t comm, ncclResult_t started, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ncclResult_t state = started;
    while (state == ncclInProgress) {
      if (interrupted()) fail(what + ": interrupted (Ctrl-C)", __FILE__, __LINE__);
      if (std::chrono::steady_clock::now() > deadline) {
        fail(what + ": not done after " + std::to_string(timeout.count()) + " ms (a rank stopped, or the ranks disagree on the collectives)",
             __FILE__, __LINE__);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclSystemError;
    }
    if (state != ncclSuccess) fail(what + ": " + ncclGetErrorString(state), __FILE__, __LINE__);
  }

  static ncclConfig_t non_blocking() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return config;
  }
};

NcclPeers::NcclPeers(Communicator& bootstrap, const std::vector<std::vector<int>>& groups, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.rank = bootstrap.rank();
  s.timeout = timeout;
  // The id goes from rank 0 to every rank as bytes (tag 0 of a context the step's messages never use).
  ncclUniqueId id{};
  constexpr int kIdTag = 0x7E1D;
  if (s.rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) s.fail("ncclGetUniqueId failed", __FILE__, __LINE__);
    for (int r = 1; r < bootstrap.size(); ++r) bootstrap.send(r, kIdTag, std::as_bytes(std::span(&id, 1)));
  } else {
    const std::vector<std::byte> bytes = bootstrap.recv(0, kIdTag);
    if (bytes.size() != sizeof id) s.fail("the NCCL id from rank 0 has " + std::to_string(bytes.size()) + " bytes", __FILE__, __LINE__);
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  ncclConfig_t config = Impl::non_blocking();
  ncclComm_t world = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&world, bootstrap.size(), id, s.rank, &config);
  s.world = world;
  s.settle(world, started, "ncclCommInitRankConfig");
  const std::vector<int> everyone = all_ranks(bootstrap);
  for (const auto& members : groups) {
    if (members == everyone || s.groups.count(members)) continue;
    const bool in = std::find(members.begin(), members.end(), s.rank) != members.end();
    ncclComm_t sub = nullptr;
    ncclConfig_t sub_config = Impl::non_blocking();
    const ncclResult_t split = ncclCommSplit(world, in ? 1 : NCCL_SPLIT_NOCOLOR, s.rank, &sub, &sub_config);
    s.settle(world, split, "ncclCommSplit");
    if (in) s.groups[members] = sub;
  }
}

NcclPeers::~NcclPeers() {
  if (impl_->aborted) return;
  for (ncclComm_t c : impl_->all()) ncclCommDestroy(c);
}

void NcclPeers::all_reduce_sum(const std::vector<int>& group, float* data, std::int64_t n, cudaStream_t stream) {
  all_reduce(group, data, n, false, stream);
}

void NcclPeers::all_reduce_sum_bf16(const std::vector<int>& group, std::uint16_t* data, std::int64_t n, cudaStream_t stream) {
  all_reduce(group, data, n, true, stream);
}

void NcclPeers::all_reduce(const std::vector<int>& group, void* data, std::int64_t n, bool bf16, cudaStream_t stream) {
  Impl& s = *impl_;
  if (s.aborted) s.fail("all-reduce after the communicators were aborted", __FILE__, __LINE__);
  const auto it = s.groups.find(group);
  ncclComm_t comm = it != s.groups.end() ? it->second : s.world;
  if (it == s.groups.end()) {
    int size = 0;
    ncclCommCount(s.world, &size);
    if (static_cast<int>(group.size()) != size) s.fail("all-reduce over a group that was not prepared", __FILE__, __LINE__);
  }
  const ncclResult_t started = ncclAllReduce(data, data, static_cast<std::size_t>(n), bf16 ? ncclBfloat16 : ncclFloat, ncclSum, comm, stream);
  s.settle(comm, started, "ncclAllReduce of " + std::to_string(n) + (bf16 ? " bf16 values" : " floats"));
}

void NcclPeers::send(int peer, const void* data, std::int64_t bytes, cudaStream_t stream) {
  Impl& s = *impl_;
  if (s.aborted) s.fail("send after the communicators were aborted", __FILE__, __LINE__);
  const ncclResult_t started = ncclSend(data, static_cast<std::size_t>(bytes), ncclUint8, peer, s.world, stream);
  s.settle(s.world, started, "ncclSend of " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer));
}

void NcclPeers::recv(int peer, void* data, std::int64_t bytes, cudaStream_t stream) {
  Impl& s = *impl_;
  if (s.aborted) s.fail("receive after the communicators were aborted", __FILE__, __LINE__);
  const ncclResult_t started = ncclRecv(data, static_cast<std::size_t>(bytes), ncclUint8, peer, s.world, stream);
  s.settle(s.world, started, "ncclRecv of " + std::to_string(bytes) + " bytes from rank " + std::to_string(peer));
}

void NcclPeers::all_to_all(const std::vector<int>& ranks, const std::vector<ConstBytes>& sends, const std::vector<Bytes>& recvs,
                           cudaStream_t stream) {
  Impl& s = *impl_;
  if (s.aborted) s.fail("all-to-all after the communicators were aborted", __FILE__, __LINE__);
  int me = 0;
  ncclCommUserRank(s.world, &me);
  const ncclResult_t opened = ncclGroupStart();
  if (opened != ncclSuccess) s.fail(std::string("ncclGroupStart: ") + ncclGetErrorString(opened), __FILE__, __LINE__);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == me) {
      if (cudaMemcpyAsync(recvs[i].data, sends[i].data, static_cast<std::size_t>(sends[i].size), cudaMemcpyDeviceToDevice, stream) != cudaSuccess) {
        s.fail("cudaMemcpyAsync of this rank's own all-to-all block", __FILE__, __LINE__);
      }
      continue;
    }
    for (const ncclResult_t queued : {ncclSend(sends[i].data, static_cast<std::size_t>(sends[i].size), ncclUint8, ranks[i], s.world, stream),
                                      ncclRecv(recvs[i].data, static_cast<std::size_t>(recvs[i].size), ncclUint8, ranks[i], s.world, stream)}) {
      if (queued != ncclSuccess && queued != ncclInProgress)
        s.fail(std::string("all-to-all with rank ") + std::to_string(ranks[i]) + ": " + ncclGetErrorString(queued), __FILE__, __LINE__);
    }
  }
  s.settle(s.world, ncclGroupEnd(), "an all-to-all of " + std::to_string(ranks.size()) + " blocks (grouped ncclSend/ncclRecv)");
}

void NcclPeers::wait(const std::vector<cudaStream_t>& streams) {
  Impl& s = *impl_;
  const auto deadline = std::chrono::steady_clock::now() + s.timeout;
  for (cudaStream_t stream : streams) {
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) s.fail(std::string("cudaStreamQuery: ") + cudaGetErrorString(state), __FILE__, __LINE__);
      for (ncclComm_t c : s.all()) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c, &async) != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
          s.fail(std::string("a collective failed: ") + ncclGetErrorString(async), __FILE__, __LINE__);
        }
      }
      if (interrupted()) s.fail("waiting for the GPU's collectives: interrupted (Ctrl-C)", __FILE__, __LINE__);
      if (std::chrono::steady_clock::now() > deadline) {
        s.fail("the GPU's collectives not done after " + std::to_string(s.timeout.count()) + " ms (a rank stopped, or the ranks disagree)", __FILE__,
               __LINE__);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

}  // namespace trainyard::backend
