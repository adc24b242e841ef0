#pragma once
// The executors' link to the other ranks of a run: messages between two ranks and collectives over a group of
// ranks. One implementation per transport, never one of our own: MPI between CPU processes
// (backend/mpi_communicator.hpp); NCCL between GPUs is not written yet.
//
// No call waits for ever: each gives up after the communicator's timeout (and at Ctrl-C) and throws CommError
// naming this rank, the peer or group, the call and the tag, so a message that never comes or a rank that died
// ends the run with an error instead of a hang. A group is the ascending list of its ranks, this rank among them;
// every member must make the same collective calls on a group in the same order (the executors call them in the
// graph's order, which every rank shares).
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainyard::backend {

// A communication failure: a timeout, an interrupted wait, the transport's own error; says where it was thrown.
class CommError : public std::runtime_error {
 public:
  CommError(const std::string& what, const char* file, int line) : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what) {}
};
#define TRAINYARD_COMM_ERROR(what) ::trainyard::backend::CommError((what), __FILE__, __LINE__)

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sends `bytes` to rank `dst` under `tag` (>= 0); returns at once, the bytes copied: the message is delivered
  // while the caller goes on, so a send never waits for its receive (no cycle of sends can deadlock).
  virtual void send(int dst, int tag, std::span<const std::byte> bytes) = 0;
  // The next message from `src` under `tag` (messages between two ranks under one tag arrive in the order sent).
  virtual std::vector<std::byte> recv(int src, int tag) = 0;

  // Collectives over `group`; sums in the element type.
  virtual void all_reduce_sum(std::span<const int> group, std::span<float> data) = 0;
  virtual void all_reduce_sum(std::span<const int> group, std::span<double> data) = 0;
  virtual void broadcast(std::span<const int> group, int root, std::span<float> data) = 0;
  // Every member's `mine` (all the same length), in group order.
  virtual std::vector<float> all_gather(std::span<const int> group, std::span<const float> mine) = 0;
  // The sum over the members of `data` (a multiple of the group's size long), and this member's share of it.
  virtual std::vector<float> reduce_scatter_sum(std::span<const int> group, std::span<const float> data) = 0;
  // `data` cut into one equal block per member, block i to member i; returns the blocks received, in group order.
  virtual std::vector<float> all_to_all(std::span<const int> group, std::span<const float> data) = 0;
  // Returns once every rank has reached it (and every message this rank sent has been delivered).
  virtual void barrier() = 0;
  // Every rank, before a step, with every group the step's collectives use (in one order on all ranks): sets up
  // what they need while all ranks are known to be there, so that no call inside the step can wait without a
  // deadline (MPI's creation of a sub-communicator has none).
  virtual void prepare_groups(const std::vector<std::vector<int>>& groups) = 0;
};

// Every rank of `comm`, ascending: the group of a collective over the world.
std::vector<int> all_ranks(const Communicator& comm);

// Messages of floats, with the helpers below: the executors' tensors.
inline void send_floats(Communicator& comm, int dst, int tag, std::span<const float> data) { comm.send(dst, tag, std::as_bytes(data)); }
std::vector<float> recv_floats(Communicator& comm, int src, int tag);

}  // namespace trainyard::backend
