#include "backend/communicator.hpp"

#include <cstring>
#include <numeric>

namespace trainyard::backend {

std::vector<int> all_ranks(const Communicator& comm) {
  std::vector<int> ranks(static_cast<std::size_t>(comm.size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

std::vector<float> recv_floats(Communicator& comm, int src, int tag) {
  const std::vector<std::byte> bytes = comm.recv(src, tag);
  if (bytes.size() % sizeof(float) != 0) {
    throw TRAINYARD_COMM_ERROR("rank " + std::to_string(comm.rank()) + ": a message of " + std::to_string(bytes.size()) + " bytes from rank " +
                               std::to_string(src) + " (tag " + std::to_string(tag) + ") where floats were expected");
  }
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace trainyard::backend
