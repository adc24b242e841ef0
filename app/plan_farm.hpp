#pragma once
// The plan search spread over MPI ranks, and resumable (planner::SimulationFarm, planner::RangeFarm).
//
// Under `mpirun -np N trainyard plan ...` every rank parses the same command line; rank 0 runs the search and, for
// each wave, deals the candidates out round-robin (its own share included), sends each other rank its share as one
// message (the length, the batch and each plan's scheme and parameters; with --lengths, each range job's groups
// and plan), simulates its own on its threads, then gathers the results and carries on exactly as one process
// would: the same waves, the same pruning, the same answer. The other ranks only serve waves until rank 0 says
// stop. Every wait of rank 0 is bounded by --rank-timeout
// (a rank that stops answering ends the run with an error naming it: backend/mpi_communicator.hpp); a rank that
// dies ends the run through mpirun.
//
// --resume FILE keeps every simulated plan's metrics in FILE (one JSON line each, appended as waves finish, the
// first line naming the inputs); a search given a FILE that exists takes the plans found there instead of
// simulating them again, so an interrupted search picks up where it stopped.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/program_options.hpp>

#include <nlohmann/json.hpp>

#include "planner/hotspa.hpp"
#include "planner/search.hpp"

namespace trainyard::backend {
class MpiSession;
class MpiCommunicator;
}  // namespace trainyard::backend

namespace trainyard::app {

class PlanFarm {
 public:
  // Joins the ranks when this process was started by mpirun with more than one rank (nullopt otherwise). A
  // collective call: every rank makes it.
  static std::unique_ptr<PlanFarm> join(std::chrono::milliseconds rank_timeout);
  ~PlanFarm();  // rank 0: tells the others to stop
  PlanFarm(const PlanFarm&) = delete;
  PlanFarm& operator=(const PlanFarm&) = delete;

  bool root() const;
  int size() const;
  // Rank 0's farm for SearchOptions::farm: `local` are the options this rank simulates its share with.
  planner::SimulationFarm farm(const planner::SearchOptions& local);
  // The other ranks: simulate the waves rank 0 sends (with `local`, under `base`'s model and cluster) until it
  // says stop; returns the exit code.
  int serve(const planner::StepInputs& base, const planner::SearchOptions& local);
  // The same for the hot-switching search's range phase (HotSpaSearchOptions::farm), every rank simulating with
  // a RangeSimulator prepared from the same inputs.
  planner::RangeFarm range_farm(const planner::RangeSimulator& local);
  int serve_ranges(const planner::RangeSimulator& local);

  // Any work as JSON (validate's cases use it): what a rank makes of its share of a wave, one result per item, in
  // order.
  using Work = std::function<std::vector<nlohmann::json>(const nlohmann::json& header, const std::vector<nlohmann::json>& items)>;
  // Rank 0: `items` dealt out, each other rank sent `header` and its share, this rank's share done with `work`;
  // the results in the items' order (nullopt: not answered, the run interrupted). With `costs` (one per item, in
  // any unit), the costliest first, each to the rank with the least so far; without, round-robin.
  std::vector<std::optional<nlohmann::json>> deal(const nlohmann::json& header, const std::vector<nlohmann::json>& items, const Work& work,
                                                  const std::vector<double>& costs = {});
  // The other ranks: `work` on each wave until rank 0 says stop; returns the exit code.
  int serve_with(const Work& work);
  // An error on any rank ends every rank (MPI_Abort), after printing it.
  [[noreturn]] void abort_after(const std::exception& error);

 private:
  PlanFarm(std::unique_ptr<backend::MpiSession> session, std::unique_ptr<backend::MpiCommunicator> comm);
  std::unique_ptr<backend::MpiSession> session_;
  std::unique_ptr<backend::MpiCommunicator> comm_;
};

// --resume FILE around a farm (or this process's threads): plans already in FILE are not simulated again, and
// every new result is appended. `inputs_key` names what the results depend on besides the length and the batch
// (model, node, nodes, stack, precision, headroom, executable); a FILE written for other inputs is refused.
// With --lengths, the range phase's group results are kept the same way (wrap_ranges), keyed by the job's groups
// (i, j) and plan; `inputs_key` then also names the drawn mini-batch and the group bounds.
class ResumeFile {
 public:
  ResumeFile(std::string path, std::string inputs_key);
  // Not moved: the farms wrap() and wrap_ranges() return refer to this object.
  ResumeFile(const ResumeFile&) = delete;
  ResumeFile& operator=(const ResumeFile&) = delete;
  planner::SimulationFarm wrap(planner::SimulationFarm inner);
  planner::RangeFarm wrap_ranges(planner::RangeFarm inner);
  std::size_t reused() const { return reused_; }
  std::size_t loaded() const { return results_.size() + range_results_.size(); }

 private:
  static std::string key(std::int64_t seq_len, std::int64_t global_batch, const planner::PlanSpec& spec);
  static std::string range_key(std::size_t i, std::size_t j, const planner::PlanSpec& spec);
  std::uintmax_t load();
  void load_line(const nlohmann::json& j, const std::string& origin);
  void append(const planner::StepInputs& in, const planner::PlanSpec& spec, const std::optional<planner::PlanMetrics>& m);
  void append_range(const planner::RangeJob& job, const planner::GroupResult& g);

  std::string path_, inputs_key_;
  std::map<std::string, std::optional<planner::PlanMetrics>> results_;
  std::map<std::string, planner::GroupResult> range_results_;
  std::ofstream out_;
  std::size_t reused_ = 0;
};

// plan's --rank-timeout and --resume (validate takes --rank-timeout alone).
void add_farm_options(boost::program_options::options_description& options, bool with_resume = true);
// --rank-timeout, checked.
std::chrono::milliseconds rank_timeout(const boost::program_options::variables_map& vm);

}  // namespace trainyard::app
