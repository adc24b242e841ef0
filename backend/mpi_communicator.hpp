#pragma once
// The Communicator over MPI (OpenMPI from Debian): one rank per process, started by `mpirun -np N trainyard ...`.
// Every wait is a loop of MPI_Test / MPI_Iprobe with a deadline and a Ctrl-C check (MPI's blocking calls cannot
// time out), so a lost message ends in CommError; the caller then calls abort_all(), which takes the other ranks
// down with it (MPI_Abort) instead of leaving them waiting.
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/communicator.hpp"

namespace trainyard::backend {

// MPI for this process: initialised when the process was started by mpirun (OpenMPI's or a PMI launcher's
// environment says so), else not touched at all (a plain `trainyard run` is one rank without MPI).
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  bool active() const { return active_; }
  // Whether the environment says this process is one rank of an mpirun.
  static bool launched_by_mpirun();
  // The run's ranks as the environment says (1 outside mpirun), readable before MPI starts.
  static int world_size_from_environment();
  // The MPI library's own version line (MPI_Get_library_version), e.g. "Open MPI v4.1.4, ...", first line only.
  static std::string library_version();
  // Ends every rank of the run (MPI_Abort) with `exit_code`, after this rank's error was printed.
  [[noreturn]] static void abort_all(int exit_code);
  // A rank's failure under mpirun: prints "error: rank R of N: what" and ends every rank, with exit code 2 for an
  // InputError (bad input, as the CLI exits alone) and 1 for anything else.
  [[noreturn]] static void abort_all_after(const std::exception& error, int rank, int size);

 private:
  bool active_ = false;
};

// Several threads may call it (the CPU device's streams, each sending, receiving or reducing on its own thread):
// one mutex makes its MPI calls one at a time (MPI_THREAD_SERIALIZED), and a call that waits releases it between
// its polls, so one thread's wait for a message never holds up another thread's send.
class MpiCommunicator final : public Communicator {
 public:
  // Over all ranks of an active session, in a context of its own (every rank constructs its communicators in the
  // same order: a collective call); `timeout` bounds every wait.
  explicit MpiCommunicator(std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int dst, int tag, std::span<const std::byte> bytes) override;
  std::vector<std::byte> recv(int src, int tag) override;
  // Until every send this rank started has been delivered (bounded by the timeout, like every wait). A large
  // message moves only while its sender calls MPI, so a rank about to compute for long without calling MPI
  // (app/plan_farm.cpp: rank 0's own share of a wave) delivers first, or the receivers wait for it.
  void deliver_sends();
  void all_reduce_sum(std::span<const int> group, std::span<float> data) override;
  void all_reduce_sum(std::span<const int> group, std::span<double> data) override;
  void broadcast(std::span<const int> group, int root, std::span<float> data) override;
  std::vector<float> all_gather(std::span<const int> group, std::span<const float> mine) override;
  std::vector<float> reduce_scatter_sum(std::span<const int> group, std::span<const float> data) override;
  std::vector<float> all_to_all(std::span<const int> group, std::span<const float> data) override;
  void barrier() override;
  void prepare_groups(const std::vector<std::vector<int>>& groups) override;

 private:
  struct World;                               // this communicator's duplicate of MPI_COMM_WORLD (mpi.h stays out of this header)
  struct Pending;                             // a send in flight and its bytes
  struct Group;                               // a sub-communicator and this rank's place in it
  using Lock = std::unique_lock<std::mutex>;  // held by the calling thread while it calls MPI
  const Group& group_of(std::span<const int> ranks);
  // Calls `done` (with the lock) until it says true; the lock is released while it waits between calls.
  void poll(const std::function<bool()>& done, const std::string& what, const std::string& cause, Lock& lock);
  void wait(void* request, const std::string& what, Lock& lock);  // MPI_Request*, until done, the deadline or Ctrl-C
  // A non-blocking call's return code `started` checked, then its request waited for.
  void complete(int started, void* request, const std::string& what, Lock& lock);
  void reap_sends();  // forgets the sends that have completed
  void barrier(Lock& lock);
  std::string who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(size_); }

  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<World> world_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Pending>> sends_;
  std::map<std::vector<int>, std::unique_ptr<Group>> groups_;
};

}  // namespace trainyard::backend
