#include "backend/mpi_communicator.hpp"

#include <mpi.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "common/error.hpp"
#include "common/interrupt.hpp"

namespace trainyard::backend {

namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

void check(int code, const std::string& what) {
  if (code != MPI_SUCCESS) throw TRAINYARD_COMM_ERROR(what + ": " + mpi_error(code));
}

int count_of(std::size_t n, const std::string& what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw TRAINYARD_COMM_ERROR(what + ": " + std::to_string(n) + " elements, more than one MPI call carries");
  return static_cast<int>(n);
}

}  // namespace

// --- the session -------------------------------------------------------------------------------------------------

bool MpiSession::launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

int MpiSession::world_size_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* value = std::getenv(name)) {
      const int size = std::atoi(value);
      if (size > 0) return size;
    }
  }
  return 1;
}

std::string MpiSession::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "MPI (version unknown)";
  std::string version(text, static_cast<std::size_t>(std::clamp(length, 0, MPI_MAX_LIBRARY_VERSION_STRING)));
  version = version.substr(0, version.find_first_of("\n,"));
  return version.empty() ? "MPI (version unknown)" : version;
}

MpiSession::MpiSession() {
  if (!launched_by_mpirun()) return;
  int provided = 0;
  // Serialized: the executor's CPU device calls MPI from a stream's thread while the main thread waits for it.
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    throw CommError("MPI_Init_thread: this MPI gives thread level " + std::to_string(provided) + ", the executor needs MPI_THREAD_SERIALIZED",
                    __FILE__, __LINE__);
  }
  // Errors come back as codes (turned into CommError) instead of MPI's default of ending the process.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  active_ = true;
}

MpiSession::~MpiSession() {
  if (active_) MPI_Finalize();
}

void MpiSession::abort_all(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever did
}

void MpiSession::abort_all_after(const std::exception& error, int rank, int size) {
  std::cerr << "error: rank " << rank << " of " << size << ": " << error.what() << "\n";
  abort_all(dynamic_cast<const InputError*>(&error) ? 2 : 1);
}

// --- the communicator ----------------------------------------------------------------------------------------------

struct MpiCommunicator::Pending {
  std::vector<std::byte> bytes;
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what;
};

struct MpiCommunicator::World {
  MPI_Comm comm = MPI_COMM_NULL;  // MPI_COMM_WORLD's duplicate
};

struct MpiCommunicator::Group {
  MPI_Comm comm = MPI_COMM_NULL;
  int size = 0, my_index = 0;
  std::vector<int> ranks;
  std::string name;
};

MpiCommunicator::MpiCommunicator(std::chrono::milliseconds timeout) : timeout_(timeout) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) throw TRAINYARD_COMM_ERROR("MPI is not initialised: start the run with mpirun (backend::MpiSession)");
  // A context of its own (collective: every rank constructs its communicators in the same order), so messages
  // left over by a run that failed never match another communicator's receives.
  MPI_Comm world = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  world_ = std::make_unique<World>();
  world_->comm = world;
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // a communicator that outlived its session: MPI has freed everything already
  // Sends still in flight after an error: cancelled, so that MPI_Finalize does not wait for them.
  for (auto& p : sends_) {
    if (p->request != MPI_REQUEST_NULL) {
      MPI_Cancel(&p->request);
      MPI_Request_free(&p->request);
    }
  }
  for (auto& [ranks, group] : groups_) {
    if (group->comm != MPI_COMM_NULL) MPI_Comm_free(&group->comm);
  }
  if (world_ && world_->comm != MPI_COMM_NULL) MPI_Comm_free(&world_->comm);
}

// How a wait polls (measured with `mpirun -np 2 trainyard calibrate --device cpu` on a 2-core VM, 2026-11-28): a
// message of 64 B took 180 us one way when every poll slept (a sleep lasts at least the thread's timer slack, 50 us
// by default), 10 us with the first 30 us of a wait spent yielding between polls and the slack at 1 ns; and MPI's
// non-blocking all-reduce only advances inside MPI_Test, so a 16 MiB one took 400 ms with sleeps growing to 1 ms
// against 40 ms with them capped at 50 us.
namespace {

constexpr auto kSpinBeforeSleeping = std::chrono::microseconds(30);
constexpr auto kLongestSleep = std::chrono::microseconds(50);

void use_fine_timer_slack() {
#ifdef __linux__
  thread_local const bool set = prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0;  // per thread; failure only costs latency
  (void)set;
#endif
}

}  // namespace

// Calls `done` until it says true: yielding between calls for the first kSpinBeforeSleeping, then sleeping from
// 1 us, doubling up to kLongestSleep (without the lock); Ctrl-C or the timeout end the wait with CommError
// ("what: nothing came within ...", with `cause` saying what that usually means).
void MpiCommunicator::poll(const std::function<bool()>& done, const std::string& what, const std::string& cause, Lock& lock) {
  use_fine_timer_slack();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  auto pause = std::chrono::microseconds(1);
  while (!done()) {
    if (interrupted()) throw TRAINYARD_COMM_ERROR(who() + ": " + what + ": interrupted");
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      throw TRAINYARD_COMM_ERROR(who() + ": " + what + ": nothing came within " + std::to_string(std::chrono::duration<double>(timeout_).count()) +
                                 " s (" + cause + ")");
    }
    lock.unlock();
    if (now - start < kSpinBeforeSleeping) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, kLongestSleep);
    }
    lock.lock();
  }
}

void MpiCommunicator::wait(void* request, const std::string& what, Lock& lock) {
  auto* r = static_cast<MPI_Request*>(request);
  poll(
      [&] {
        int done = 0;
        check(MPI_Test(r, &done, MPI_STATUS_IGNORE), who() + ": " + what);
        return done != 0;
      },
      what, "a rank stopped, or the ranks do not agree on the order of their messages", lock);
}

void MpiCommunicator::complete(int started, void* request, const std::string& what, Lock& lock) {
  check(started, who() + ": " + what);
  wait(request, what, lock);
}

void MpiCommunicator::reap_sends() {
  for (auto& p : sends_) {
    int done = 0;
    check(MPI_Test(&p->request, &done, MPI_STATUS_IGNORE), who() + ": " + p->what);
  }
  std::erase_if(sends_, [](const std::unique_ptr<Pending>& p) { return p->request == MPI_REQUEST_NULL; });
}

void MpiCommunicator::send(int dst, int tag, std::span<const std::byte> bytes) {
  const Lock lock(mutex_);
  auto p = std::make_unique<Pending>();
  p->bytes.assign(bytes.begin(), bytes.end());
  p->what = "send of " + std::to_string(bytes.size()) + " bytes to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
  if (dst < 0 || dst >= size_ || dst == rank_) throw TRAINYARD_COMM_ERROR(who() + ": " + p->what + ": no such peer");
  check(MPI_Isend(p->bytes.data(), count_of(p->bytes.size(), p->what), MPI_BYTE, dst, tag, world_->comm, &p->request), who() + ": " + p->what);
  sends_.push_back(std::move(p));
  reap_sends();
}

void MpiCommunicator::deliver_sends() {
  Lock lock(mutex_);
  reap_sends();
  std::string what;  // the sends still in flight, each naming its receiver
  for (const auto& p : sends_) what += (what.empty() ? "" : ", ") + p->what;
  poll(
      [&] {
        reap_sends();
        return sends_.empty();
      },
      "delivery of the " + what, "a receiver stopped, or the ranks do not agree on the order of their messages", lock);
}

std::vector<std::byte> MpiCommunicator::recv(int src, int tag) {
  const std::string what = "receive from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
  if (src < 0 || src >= size_ || src == rank_) throw TRAINYARD_COMM_ERROR(who() + ": " + what + ": no such peer");
  Lock lock(mutex_);
  MPI_Status status;
  poll(
      [&] {
        int arrived = 0;
        check(MPI_Iprobe(src, tag, world_->comm, &arrived, &status), who() + ": " + what);
        if (!arrived) reap_sends();  // our own sends go on while we wait
        return arrived != 0;
      },
      what, "the sender stopped, or the ranks do not agree on the order of their messages", lock);
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::vector<std::byte> bytes(static_cast<std::size_t>(count));
  check(MPI_Recv(bytes.data(), count, MPI_BYTE, src, tag, world_->comm, MPI_STATUS_IGNORE), who() + ": " + what);
  return bytes;
}

const MpiCommunicator::Group& MpiCommunicator::group_of(std::span<const int> ranks) {
  std::vector<int> key(ranks.begin(), ranks.end());
  auto it = groups_.find(key);
  if (it != groups_.end()) return *it->second;
  auto g = std::make_unique<Group>();
  g->ranks = key;
  g->size = static_cast<int>(key.size());
  for (int r : key) g->name += (g->name.empty() ? "" : ",") + std::to_string(r);
  g->name = "group {" + g->name + "}";
  if (!std::is_sorted(key.begin(), key.end()) || std::adjacent_find(key.begin(), key.end()) != key.end() || key.empty() || key.front() < 0 ||
      key.back() >= size_) {
    throw TRAINYARD_COMM_ERROR(who() + ": " + g->name + ": a group is distinct ranks in ascending order");
  }
  const auto mine = std::find(key.begin(), key.end(), rank_);
  if (mine == key.end()) throw TRAINYARD_COMM_ERROR(who() + ": " + g->name + ": this rank is not a member");
  g->my_index = static_cast<int>(mine - key.begin());
  MPI_Group world = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
  MPI_Comm_group(world_->comm, &world);
  MPI_Group_incl(world, g->size, key.data(), &sub);
  // Collective over the members only, which create their groups in the same (graph) order.
  const int code = MPI_Comm_create_group(world_->comm, sub, 0, &g->comm);
  MPI_Group_free(&sub);
  MPI_Group_free(&world);
  check(code, who() + ": creating " + g->name);
  MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
  return *groups_.emplace(std::move(key), std::move(g)).first->second;
}

void MpiCommunicator::all_reduce_sum(std::span<const int> group, std::span<float> data) {
  Lock lock(mutex_);
  const Group& g = group_of(group);
  const std::string what = "all-reduce of " + std::to_string(data.size()) + " floats over " + g.name;
  MPI_Request r;
  complete(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count_of(data.size(), what), MPI_FLOAT, MPI_SUM, g.comm, &r), &r, what, lock);
}

void MpiCommunicator::all_reduce_sum(std::span<const int> group, std::span<double> data) {
  Lock lock(mutex_);
  const Group& g = group_of(group);
  const std::string what = "all-reduce of " + std::to_string(data.size()) + " doubles over " + g.name;
  MPI_Request r;
  complete(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count_of(data.size(), what), MPI_DOUBLE, MPI_SUM, g.comm, &r), &r, what, lock);
}

void MpiCommunicator::broadcast(std::span<const int> group, int root, std::span<float> data) {
  Lock lock(mutex_);
  const Group& g = group_of(group);
  const std::string what = "broadcast of " + std::to_string(data.size()) + " floats from rank " + std::to_string(root) + " over " + g.name;
  const auto at = std::find(g.ranks.begin(), g.ranks.end(), root);
  if (at == g.ranks.end()) throw TRAINYARD_COMM_ERROR(who() + ": " + what + ": the root is not a member");
  MPI_Request r;
  complete(MPI_Ibcast(data.data(), count_of(data.size(), what), MPI_FLOAT, static_cast<int>(at - g.ranks.begin()), g.comm, &r), &r, what, lock);
}

std::vector<float> MpiCommunicator::all_gather(std::span<const int> group, std::span<const float> mine) {
  Lock lock(mutex_);
  const Group& g = group_of(group);
  const std::string what = "all-gather of " + std::to_string(mine.size()) + " floats per rank over " + g.name;
  std::vector<float> out(mine.size() * static_cast<std::size_t>(g.size));
  const int n = count_of(mine.size(), what);
  MPI_Request r;
  complete(MPI_Iallgather(mine.data(), n, MPI_FLOAT, out.data(), n, MPI_FLOAT, g.comm, &r), &r, what, lock);
  return out;
}

std::vector<float> MpiCommunicator::reduce_scatter_sum(std::span<const int> group, std::span<const float> data) {
  Lock lock(mutex_);
  const Group& g = group_of(group);
  const std::string what = "reduce-scatter of " + std::to_string(data.size()) + " floats over " + g.name;
  if (data.size() % static_cast<std::size_t>(g.size) != 0) throw TRAINYARD_COMM_ERROR(who() + ": " + what + ": not a multiple of the group's size");
  std::vector<float> out(data.size() / static_cast<std::size_t>(g.size));
  MPI_Request r;
  complete(MPI_Ireduce_scatter_block(data.data(), out.data(), count_of(out.size(), what), MPI_FLOAT, MPI_SUM, g.comm, &r), &r, what, lock);
  return out;
}

std::vector<float> MpiCommunicator::all_to_all(std::span<const int> group, std::span<const float> data) {
  Lock lock(mutex_);
  const Group& g = group_of(group);
  const std::string what = "all-to-all of " + std::to_string(data.size()) + " floats over " + g.name;
  if (data.size() % static_cast<std::size_t>(g.size) != 0) throw TRAINYARD_COMM_ERROR(who() + ": " + what + ": not a multiple of the group's size");
  std::vector<float> out(data.size());
  const int block = count_of(data.size() / static_cast<std::size_t>(g.size), what);
  MPI_Request r;
  complete(MPI_Ialltoall(data.data(), block, MPI_FLOAT, out.data(), block, MPI_FLOAT, g.comm, &r), &r, what, lock);
  return out;
}

void MpiCommunicator::barrier() {
  Lock lock(mutex_);
  barrier(lock);
}

void MpiCommunicator::barrier(Lock& lock) {
  poll(
      [&] {
        reap_sends();
        return sends_.empty();
      },
      "delivering this rank's sends before a barrier", "a rank stopped, or the ranks do not agree on the order of their messages", lock);
  MPI_Request r;
  check(MPI_Ibarrier(world_->comm, &r), who() + ": barrier");
  wait(&r, "barrier", lock);
}

void MpiCommunicator::prepare_groups(const std::vector<std::vector<int>>& groups) {
  Lock lock(mutex_);
  barrier(lock);  // everyone is here (or this throws after the timeout)
  for (const auto& g : groups) {
    if (std::find(g.begin(), g.end(), rank_) != g.end()) group_of(g);
  }
}

}  // namespace trainyard::backend
