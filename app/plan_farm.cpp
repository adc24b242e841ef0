#include "app/plan_farm.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/mpi_communicator.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/units.hpp"
#include "planner/estimate.hpp"

using Json = nlohmann::json;

namespace trainyard::app {

namespace {

constexpr int kWaveTag = 7101, kResultTag = 7102;  // rank 0 -> a rank: a wave's share (or stop); back: its results

std::vector<std::byte> bytes_of(const Json& j) {
  const std::string text = j.dump();
  const auto* first = reinterpret_cast<const std::byte*>(text.data());
  return {first, first + text.size()};
}

Json json_of(const std::vector<std::byte>& bytes, const std::string& origin) {
  try {
    return Json::parse(reinterpret_cast<const char*>(bytes.data()), reinterpret_cast<const char*>(bytes.data()) + bytes.size());
  } catch (const Json::exception& e) {
    throw InputError(origin, "message", "JSON", e.what());
  }
}

std::optional<planner::PlanMetrics> result_of(const Json& j, const std::string& origin) {
  if (j.is_null()) return std::nullopt;
  return planner::metrics_from_record(j, origin);
}

planner::PlanMetrics cancelled_metrics() {
  planner::PlanMetrics m;
  m.failure = "cancelled";
  return m;
}

}  // namespace

// --- MPI ---------------------------------------------------------------------------------------------------------

PlanFarm::PlanFarm(std::unique_ptr<backend::MpiSession> session, std::unique_ptr<backend::MpiCommunicator> comm)
    : session_(std::move(session)), comm_(std::move(comm)) {}

std::unique_ptr<PlanFarm> PlanFarm::join(std::chrono::milliseconds rank_timeout) {
  if (!backend::MpiSession::launched_by_mpirun() || backend::MpiSession::world_size_from_environment() < 2) return nullptr;
  auto session = std::make_unique<backend::MpiSession>();
  auto comm = std::make_unique<backend::MpiCommunicator>(rank_timeout);
  return std::unique_ptr<PlanFarm>(new PlanFarm(std::move(session), std::move(comm)));
}

PlanFarm::~PlanFarm() {
  // After Ctrl-C (mpirun passes it to every rank) the others stop by themselves.
  if (!root() || interrupted()) return;
  try {
    for (int r = 1; r < size(); ++r) comm_->send(r, kWaveTag, bytes_of({{"stop", true}}));
  } catch (const std::exception& e) {
    std::cerr << "warning: telling the other ranks to stop: " << e.what() << "\n";
  }
}

bool PlanFarm::root() const { return comm_->rank() == 0; }
int PlanFarm::size() const { return comm_->size(); }

void PlanFarm::abort_after(const std::exception& error) { backend::MpiSession::abort_all_after(error, comm_->rank(), comm_->size()); }

namespace {

// Each rank's items (indices, ascending): round-robin without costs (a wave is sorted, so each gets a like mix);
// with them, the costliest first to the rank with the least cost so far (ties to the lowest rank).
std::vector<std::vector<std::size_t>> shares_of(std::size_t items, std::size_t ranks, const std::vector<double>& costs) {
  std::vector<std::vector<std::size_t>> shares(ranks);
  if (costs.size() != items) {
    for (std::size_t i = 0; i < items; ++i) shares[i % ranks].push_back(i);
    return shares;
  }
  std::vector<std::size_t> order(items);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(ranks, 0);
  for (std::size_t i : order) {
    const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += costs[i];
    shares[r].push_back(i);
  }
  for (auto& share : shares) std::sort(share.begin(), share.end());
  return shares;
}

}  // namespace

std::vector<std::optional<Json>> PlanFarm::deal(const Json& header, const std::vector<Json>& items, const Work& work,
                                                const std::vector<double>& costs) {
  const auto n = static_cast<std::size_t>(size());
  const std::vector<std::vector<std::size_t>> shares = shares_of(items.size(), n, costs);
  const auto pick = [&](const std::vector<std::size_t>& share) {
    std::vector<Json> out;
    for (std::size_t i : share) out.push_back(items[i]);
    return out;
  };
  for (std::size_t r = 1; r < n; ++r) {
    if (shares[r].empty()) continue;
    comm_->send(static_cast<int>(r), kWaveTag, bytes_of({{"stop", false}, {"header", header}, {"items", pick(shares[r])}}));
  }
  std::vector<std::optional<Json>> out(items.size());
  try {
    comm_->deliver_sends();  // before this rank computes: a large share moves only while its sender calls MPI
  } catch (const backend::CommError& e) {
    if (interrupted()) return std::vector<std::optional<Json>>(items.size());
    abort_after(e);
  }
  const std::vector<Json> own = work(header, pick(shares[0]));
  for (std::size_t k = 0; k < own.size(); ++k) out[shares[0][k]] = own[k];
  for (std::size_t r = 1; r < n; ++r) {
    if (shares[r].empty()) continue;
    const std::string origin = "rank " + std::to_string(r) + "'s results";
    std::vector<std::byte> reply;
    try {
      reply = comm_->recv(static_cast<int>(r), kResultTag);
    } catch (const backend::CommError& e) {
      if (interrupted()) return out;  // Ctrl-C: what finished stands, the rest is dropped as unanswered
      abort_after(e);                 // a rank that stopped answering: every rank ends now (unwinding would wait on it in MPI_Finalize)
    }
    const Json results = json_of(reply, origin);
    if (!results.is_array() || results.size() != shares[r].size())
      throw InputError(origin, "results", std::to_string(shares[r].size()) + " entries", results.dump().substr(0, 80));
    for (std::size_t k = 0; k < results.size(); ++k) out[shares[r][k]] = results[k];
  }
  return out;
}

int PlanFarm::serve_with(const Work& work) {
  const std::string origin = "rank 0's wave";
  for (;;) {
    std::vector<std::byte> message;
    try {
      message = comm_->recv(0, kWaveTag);
    } catch (const backend::CommError&) {
      if (interrupted()) return kInterruptedExitCode;
      continue;  // rank 0 is still busy (its bounds, its own share); were it gone, mpirun would end this rank
    }
    const Json wave = json_of(message, origin);
    if (wave.at("stop").get<bool>()) return 0;
    comm_->send(0, kResultTag, bytes_of(Json(work(wave.at("header"), wave.at("items").get<std::vector<Json>>()))));
  }
}

// --- the plan search: a wave's plans at one length and batch -------------------------------------------------------

namespace {

std::vector<Json> simulate_plans(const planner::StepInputs& base, const planner::SearchOptions& local, const Json& header,
                                 const std::vector<Json>& items) {
  const std::string origin = "rank 0's wave";
  const planner::StepInputs at{
      base.model, base.cluster, {header.at("seq_len").get<std::int64_t>(), header.at("global_batch").get<std::int64_t>()}, base.precision};
  std::vector<planner::PlanSpec> specs;
  for (const auto& p : items) specs.push_back(planner::plan_spec_from_record(p, origin));
  std::vector<Json> out;
  for (const auto& r : planner::simulate_here(at, specs, local)) out.push_back(r ? planner::metrics_record(*r) : Json(nullptr));
  return out;
}

}  // namespace

planner::SimulationFarm PlanFarm::farm(const planner::SearchOptions& local) {
  return [this, local](const planner::StepInputs& in, const std::vector<planner::PlanSpec>& specs) {
    std::vector<Json> items;
    std::vector<double> tasks;  // a simulation's cost grows with its graph's tasks
    for (const auto& spec : specs) {
      items.push_back(planner::plan_spec_record(spec));
      tasks.push_back(planner::estimate_plan(in, spec).tasks);
    }
    const Json header{{"seq_len", in.workload.seq_len}, {"global_batch", in.workload.global_batch}};
    const auto results = deal(
        header, items, [&](const Json& h, const std::vector<Json>& share) { return simulate_plans(in, local, h, share); }, tasks);
    planner::WaveResults out;
    for (const auto& r : results)
      out.push_back(!r ? std::optional<planner::PlanMetrics>(cancelled_metrics()) : result_of(*r, "another rank's results"));
    return out;
  };
}

int PlanFarm::serve(const planner::StepInputs& base, const planner::SearchOptions& local) {
  return serve_with([&](const Json& header, const std::vector<Json>& items) { return simulate_plans(base, local, header, items); });
}

// --- the hot-switching search's range phase ------------------------------------------------------------------------

namespace {

std::vector<Json> simulate_ranges(const planner::RangeSimulator& local, const std::vector<Json>& items) {
  const std::string origin = "rank 0's range jobs";
  std::vector<planner::RangeJob> jobs;
  for (const auto& j : items) {
    jobs.push_back({j.at("i").get<std::size_t>(), j.at("j").get<std::size_t>(), planner::plan_spec_from_record(j, origin)});
  }
  std::vector<Json> out;
  for (const auto& g : local.run(jobs)) out.push_back(planner::group_result_record(g));
  return out;
}

}  // namespace

planner::RangeFarm PlanFarm::range_farm(const planner::RangeSimulator& local) {
  return [this, &local](const std::vector<planner::RangeJob>& jobs) {
    std::vector<Json> items;
    for (const auto& job : jobs) {
      Json item = planner::plan_spec_record(job.spec);
      item["i"] = job.i;
      item["j"] = job.j;
      items.push_back(std::move(item));
    }
    const auto results = deal(Json::object(), items, [&](const Json&, const std::vector<Json>& share) { return simulate_ranges(local, share); });
    std::vector<planner::GroupResult> out;
    for (const auto& r : results) {
      // Unanswered (Ctrl-C): a group that did not fit, which the search drops as it stops on the flag.
      out.push_back(r ? planner::group_result_from_record(*r, "another rank's results") : planner::GroupResult{});
    }
    return out;
  };
}

int PlanFarm::serve_ranges(const planner::RangeSimulator& local) {
  return serve_with([&](const Json&, const std::vector<Json>& items) { return simulate_ranges(local, items); });
}

// --- --resume ----------------------------------------------------------------------------------------------------

ResumeFile::ResumeFile(std::string path, std::string inputs_key) : path_(std::move(path)), inputs_key_(std::move(inputs_key)) {
  const bool exists = std::filesystem::exists(path_);
  const std::uintmax_t whole_bytes = exists ? load() : 0;
  // A line a killed run cut short is dropped from the file too, so that what is appended starts a line of its own.
  if (exists && whole_bytes < std::filesystem::file_size(path_)) std::filesystem::resize_file(path_, whole_bytes);
  out_.open(path_, std::ios::app);
  if (!out_) throw InputError("--resume", "value", "a file this process can write", "\"" + path_ + "\"");
  if (whole_bytes == 0) out_ << Json{{"trainyard.plan_resume", 1}, {"inputs", inputs_key_}}.dump() << "\n" << std::flush;
}

std::string ResumeFile::key(std::int64_t seq_len, std::int64_t global_batch, const planner::PlanSpec& spec) {
  return std::to_string(seq_len) + "|" + std::to_string(global_batch) + "|" + spec.scheme + "|" + planner::parameters_json(spec).dump();
}

// The bytes of the file's whole lines: those up to a last line cut short (or to the end).
std::uintmax_t ResumeFile::load() {
  std::ifstream file(path_, std::ios::binary);
  std::string line;
  std::size_t number = 0;
  std::uintmax_t whole_bytes = 0;
  while (std::getline(file, line)) {
    ++number;
    const bool ended = !file.eof();  // the line had its newline: a run writes each line whole, newline last
    Json j;
    try {
      if (!ended) throw Json::parse_error::create(101, line.size(), "no newline", nullptr);
      j = Json::parse(line);
    } catch (const Json::exception&) {
      if (file.peek() == std::ifstream::traits_type::eof()) break;  // the last line cut short by a killed run: dropped
      throw InputError(path_, "line " + std::to_string(number), "one JSON object per line (a --resume file)", line.substr(0, 60));
    }
    whole_bytes += line.size() + 1;
    const std::string origin = path_ + ":" + std::to_string(number);
    if (number == 1) {
      if (!j.is_object() || !j.contains("inputs") || j.at("inputs") != inputs_key_)
        throw InputError(path_, "inputs", "the results of a search on these inputs (" + inputs_key_ + ")", j.dump().substr(0, 120));
      continue;
    }
    load_line(j, origin);
  }
  return whole_bytes;
}

// A plan's metrics (seq_len, global_batch, plan, metrics), or with --lengths a range job's group (i, j, plan, group).
void ResumeFile::load_line(const Json& j, const std::string& origin) {
  try {
    const planner::PlanSpec spec = planner::plan_spec_from_record(j, origin);
    if (j.contains("group")) {
      range_results_[range_key(j.at("i").get<std::size_t>(), j.at("j").get<std::size_t>(), spec)] = planner::group_result_from_record(j.at("group"),
                                                                                                                                      origin);
    } else {
      results_[key(j.at("seq_len").get<std::int64_t>(), j.at("global_batch").get<std::int64_t>(), spec)] = result_of(j.at("metrics"), origin);
    }
  } catch (const Json::exception& e) {
    throw InputError(origin, "plan", "seq_len, global_batch, scheme, parameters and metrics (or i, j, scheme, parameters and group)", e.what());
  }
}

std::string ResumeFile::range_key(std::size_t i, std::size_t j, const planner::PlanSpec& spec) {
  return std::to_string(i) + "-" + std::to_string(j) + "|" + spec.scheme + "|" + planner::parameters_json(spec).dump();
}

void ResumeFile::append(const planner::StepInputs& in, const planner::PlanSpec& spec, const std::optional<planner::PlanMetrics>& m) {
  Json line = planner::plan_spec_record(spec);
  line["seq_len"] = in.workload.seq_len;
  line["global_batch"] = in.workload.global_batch;
  line["metrics"] = m ? planner::metrics_record(*m) : Json(nullptr);
  out_ << line.dump() << "\n";
}

namespace {

// The results of `items`: those `known` holds under their key from there (counted in `reused`), the others from one
// call of `run` on them together; `keep(item, result)` is called on each new one.
template <class Item, class Result, class KeyOf, class Run, class Keep>
std::vector<Result> known_or_run(const std::vector<Item>& items, const std::map<std::string, Result>& known, KeyOf key_of, Run run, Keep keep,
                                 std::size_t& reused) {
  std::vector<Result> out(items.size());
  std::vector<Item> missing;
  std::vector<std::size_t> where;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto found = known.find(key_of(items[i]));
    if (found != known.end()) {
      out[i] = found->second;
      ++reused;
    } else {
      missing.push_back(items[i]);
      where.push_back(i);
    }
  }
  if (missing.empty()) return out;
  const std::vector<Result> fresh = run(missing);
  for (std::size_t k = 0; k < fresh.size(); ++k) {
    out[where[k]] = fresh[k];
    keep(missing[k], fresh[k]);
  }
  return out;
}

}  // namespace

planner::SimulationFarm ResumeFile::wrap(planner::SimulationFarm inner) {
  return [this, inner = std::move(inner)](const planner::StepInputs& in, const std::vector<planner::PlanSpec>& specs) {
    const auto key_of = [&](const planner::PlanSpec& spec) { return key(in.workload.seq_len, in.workload.global_batch, spec); };
    const auto keep = [&](const planner::PlanSpec& spec, const std::optional<planner::PlanMetrics>& m) {
      if (m && m->failure == "cancelled") return;  // not a result: simulated again next time
      results_[key_of(spec)] = m;
      append(in, spec, m);
    };
    planner::WaveResults out = known_or_run(
        specs, results_, key_of, [&](const std::vector<planner::PlanSpec>& missing) { return inner(in, missing); }, keep, reused_);
    out_.flush();
    return out;
  };
}

void ResumeFile::append_range(const planner::RangeJob& job, const planner::GroupResult& g) {
  Json line = planner::plan_spec_record(job.spec);
  line["i"] = job.i;
  line["j"] = job.j;
  line["group"] = planner::group_result_record(g);
  out_ << line.dump() << "\n";
}

planner::RangeFarm ResumeFile::wrap_ranges(planner::RangeFarm inner) {
  return [this, inner = std::move(inner)](const std::vector<planner::RangeJob>& jobs) {
    const auto key_of = [](const planner::RangeJob& job) { return range_key(job.i, job.j, job.spec); };
    const auto keep = [&](const planner::RangeJob& job, const planner::GroupResult& g) {
      if (g.spec.scheme.empty()) return;  // not answered (Ctrl-C): simulated again next time
      range_results_[key_of(job)] = g;
      append_range(job, g);
    };
    std::vector<planner::GroupResult> out = known_or_run(jobs, range_results_, key_of, inner, keep, reused_);
    out_.flush();
    return out;
  };
}

std::chrono::milliseconds rank_timeout(const boost::program_options::variables_map& vm) {
  const double seconds = vm["rank-timeout"].as<double>();
  if (!(seconds > 0 && seconds <= 86400)) throw InputError("--rank-timeout", "value", "seconds in (0, 86400]", format_number(seconds));
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

void add_farm_options(boost::program_options::options_description& options, bool with_resume) {
  options.add_options()("rank-timeout", boost::program_options::value<double>()->default_value(600)->value_name("seconds"),
                        "under mpirun: how long rank 0 waits for another rank's simulations before ending the run with an error naming it");
  if (!with_resume) return;
  options.add_options()(
      "resume", boost::program_options::value<std::string>()->value_name("path"),
      "keep every simulated plan's metrics in this file and reuse those already there (an interrupted search picks up where it stopped)");
}

}  // namespace trainyard::app
