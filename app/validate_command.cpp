// `trainyard validate`: every case of the public validation suite (validation/datasets/*.json, built in; --cases
// FILE replaces it), each a published measurement beside trainyard's prediction of it, with the error per figure and the
// mean absolute percentage error (MAPE) per dataset. --baseline fails (exit 1) when a dataset got worse than the
// recorded figures, so CI holds the model to what it has reached; --write-baseline records them.
//
// A case is `trainyard simulate` flags (a scheme step or --collective) or an attention kernel shape, the figures
// its source published, and the FLOP convention of those figures (models/model.hpp FlopConvention), so the
// prediction is stated in the source's own terms.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/error_bars.hpp"
#include "app/plan_farm.hpp"
#include "app/validation_suite.hpp"
#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/interrupt.hpp"
#include "common/json_reader.hpp"
#include "common/units.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

namespace {

// A dataset's figures under one run: MAPE over the numeric comparisons, and max-length matches.
struct DatasetScore {
  double mape = 0;
  int compared = 0;
  int max_seq_equal = 0;
  int max_seq_total = 0;
  int not_simulated = 0;
  double estimate_mape = 0;  // the analytic estimate's, over the figures it gives (a step's, but its max length)
  int estimate_compared = 0;
};

DatasetScore score(const std::vector<CaseResult>& results) {
  DatasetScore s;
  double sum = 0;
  for (const auto& r : results) {
    if (!r.error.empty()) {
      ++s.not_simulated;
      continue;
    }
    for (const auto& c : r.comparisons) {
      if (!c.counted) continue;  // a calibration figure
      if (c.metric == "max_seq") {
        ++s.max_seq_total;
        if (c.predicted == c.published) ++s.max_seq_equal;
      } else {
        sum += std::abs(c.relative_error());
        ++s.compared;
        if (c.has_estimate()) {
          s.estimate_mape += std::abs(c.estimate_error());
          ++s.estimate_compared;
        }
      }
    }
  }
  s.mape = s.compared ? sum / s.compared : 0;
  if (s.estimate_compared) s.estimate_mape /= s.estimate_compared;
  return s;
}

std::string format_figure(const std::string& metric, double value) {
  if (metric == "max_seq") return format_tokens(static_cast<std::int64_t>(value));
  if (metric == "mfu") return format_fixed(100 * value, 1) + "%";
  if (metric == "speedup") return format_fixed(value, 2) + "x";
  return format_fixed(value, value >= 100 ? 0 : value >= 10 ? 1 : 2);
}

// "equal"/"differs" for a max length, the signed relative error otherwise.
std::string error_text(const Comparison& c) {
  if (c.metric == "max_seq") return c.predicted == c.published ? "equal" : "differs";
  return format_fixed(100 * c.relative_error(), 1) + "%" + (c.counted ? "" : " (calibration)");
}

// "MAPE 24.4% over 45 figures; max length equal in 7 of 10; 1 case(s) not simulated"
std::string summary_text(const DatasetScore& s) {
  std::string out = "MAPE " + format_fixed(100 * s.mape, 1) + "% over " + std::to_string(s.compared) + " figures";
  if (s.max_seq_total) out += "; max length equal in " + std::to_string(s.max_seq_equal) + " of " + std::to_string(s.max_seq_total);
  if (s.not_simulated) out += "; " + std::to_string(s.not_simulated) + " case(s) not simulated";
  if (s.estimate_compared) {
    out += "; the analytic estimate (not simulated): MAPE " + format_fixed(100 * s.estimate_mape, 1) + "% over " +
           std::to_string(s.estimate_compared) + " of them";
  }
  return out;
}

// A dataset's score under another reading of its source (ValidationReading).
struct ReadingScore {
  ValidationReading reading;
  DatasetScore score;
};

std::string reading_text(const ReadingScore& r) {
  std::string out = "under the reading \"" + r.reading.name + "\"";
  if (r.reading.convention) out += " (FLOP convention: " + r.reading.convention_text + ")";
  return out + ": " + summary_text(r.score);
}

void print_text(const ValidationDataset& d, const std::vector<CaseResult>& results, const DatasetScore& s,
                const std::vector<ReadingScore>& readings) {
  std::cout << d.name << ": " << d.title << "\n  source: " << d.source << "\n";
  for (const auto& r : results) {
    if (!r.error.empty()) {
      std::cout << "  " << r.name << ": not simulated: " << r.error << "\n";
      continue;
    }
    for (const auto& c : r.comparisons) {
      std::cout << "  " << r.name << "  " << c.metric << "  published " << format_figure(c.metric, c.published) << "  predicted "
                << format_figure(c.metric, c.predicted) << (c.metric == "max_seq" ? "  " : "  error ") << error_text(c) << "\n";
    }
    if (!r.remark.empty()) std::cout << "  " << r.name << ": " << r.remark << "\n";
  }
  std::cout << "  " << summary_text(s) << "\n";
  for (const auto& r : readings) std::cout << "  " << reading_text(r) << "\n";
  std::cout << "\n";
}

void print_markdown(const ValidationDataset& d, const std::vector<CaseResult>& results, const DatasetScore& s,
                    const std::vector<ReadingScore>& readings) {
  std::cout << "### " << d.name << ": " << d.title << "\n\nSource: " << d.source << "  \nFLOP convention: " << d.convention_text
            << "\n\n| case | figure | published | predicted | error |\n|---|---|---:|---:|---:|\n";
  for (const auto& r : results) {
    if (!r.error.empty()) {
      std::cout << "| " << r.name << " | | | not simulated: " << r.error << " | |\n";
      continue;
    }
    for (const auto& c : r.comparisons) {
      std::cout << "| " << r.name << " | " << c.metric << " | " << format_figure(c.metric, c.published) << " | "
                << format_figure(c.metric, c.predicted) << " | " << error_text(c) << " |\n";
    }
    if (!r.remark.empty()) std::cout << "| " << r.name << " | | | " << r.remark << " | |\n";
  }
  std::cout << "\n" << summary_text(s) << ".\n\n";
  for (const auto& r : readings) std::cout << "- " << reading_text(r) << ".\n";
  if (!readings.empty()) std::cout << "\n";
}

Json score_json(const DatasetScore& s) {
  return {{"mape", s.mape},
          {"compared", s.compared},
          {"max_seq_equal", s.max_seq_equal},
          {"max_seq_total", s.max_seq_total},
          {"not_simulated", s.not_simulated},
          {"estimate", {{"provisional", true}, {"mape", s.estimate_mape}, {"compared", s.estimate_compared}}}};
}

Json results_json(const ValidationDataset& d, const std::vector<CaseResult>& results, const DatasetScore& s,
                  const std::vector<ReadingScore>& readings) {
  Json cases = Json::array();
  for (const auto& r : results) {
    Json c = {{"name", r.name}};
    if (!r.error.empty()) c["not_simulated"] = r.error;
    if (!r.remark.empty()) c["remark"] = r.remark;
    Json figures = Json::array();
    for (const auto& f : r.comparisons) {
      figures.push_back({{"metric", f.metric},
                         {"published", f.published},
                         {"predicted", f.predicted},
                         {"relative_error", f.relative_error()},
                         {"counted", f.counted}});
    }
    c["figures"] = figures;
    cases.push_back(c);
  }
  Json out = {{"dataset", d.name}, {"title", d.title}, {"source", d.source}, {"cases", cases}};
  out.update(score_json(s));
  Json other = Json::array();
  for (const auto& r : readings) {
    Json reading = {{"reading", r.reading.name}};
    reading.update(score_json(r.score));
    other.push_back(reading);
  }
  if (!readings.empty()) out["readings"] = other;
  return out;
}

// The recorded figures per dataset for this mode ("fast" or "all"); a dataset is worse when its MAPE rose, fewer
// max lengths match, or more cases could not be predicted (which would also shrink the MAPE's sample). Returns
// the regressions, one line each.
std::vector<std::string> regressions(const Json& baseline_mode, const std::map<std::string, DatasetScore>& scores, const std::string& origin) {
  std::vector<std::string> worse;
  for (const auto& [name, s] : scores) {
    if (!baseline_mode.contains(name)) continue;
    const json::Reader b(baseline_mode[name], origin, name);
    const double mape = b.number("mape", {0, 1e9, "", false});
    const double equal = static_cast<double>(b.integer("max_seq_equal", 0, 1000000));
    const auto not_simulated = b.has("not_simulated") ? b.integer("not_simulated", 0, 1000000) : 0;
    constexpr double kTolerance = 1e-6;  // the simulation is deterministic: any rise is a change of the model
    if (s.mape > mape + kTolerance) {
      worse.push_back(name + ": MAPE " + format_fixed(100 * s.mape, 2) + "% against the recorded " + format_fixed(100 * mape, 2) + "%");
    }
    if (s.max_seq_equal < equal) {
      worse.push_back(name + ": max length equal in " + std::to_string(s.max_seq_equal) + " cases against the recorded " + format_fixed(equal, 0));
    }
    if (s.not_simulated > not_simulated) {
      worse.push_back(name + ": " + std::to_string(s.not_simulated) + " cases not predicted against the recorded " + std::to_string(not_simulated));
    }
  }
  return worse;
}

void write_baseline(const std::string& path, const std::string& mode, const std::map<std::string, DatasetScore>& scores) {
  Json doc = {{"schema", "trainyard.validation-baseline.v1"}};
  if (std::filesystem::exists(path)) doc = json::parse(read_input_file(path, kJsonFileCapBytes, "a baseline JSON file"), path);
  Json figures = Json::object();
  for (const auto& [name, s] : scores) figures[name] = score_json(s);
  doc[mode] = figures;
  write_file_atomically(path, std::string_view(doc.dump(2) + "\n"));
}

// Each step case's figures about the step's speed, as error records (app/error_bars.hpp).
void add_error_records(const ValidationDataset& d, const std::vector<CaseResult>& results, std::vector<ErrorRecord>& records) {
  for (const auto& r : results) {
    if (!r.kind || !r.error.empty()) continue;
    for (const auto& c : r.comparisons) {
      if (!c.counted) continue;  // a calibration figure says nothing of the model's error
      if (const auto e = step_time_error(c.metric, c.published, c.predicted)) records.push_back({d.name, r.name, c.metric, *r.kind, *e});
    }
  }
}

// "error bars (each case left out of its own): cover 37 of 47 published step figures (79%); 4 have no validated case near them"
std::string coverage_text(const Coverage& c) {
  std::string out = "error bars (each case left out of its own): cover " + std::to_string(c.covered) + " of " + std::to_string(c.with_bar) +
                    " published step figures";
  if (c.with_bar) out += " (" + format_fixed(100.0 * c.covered / c.with_bar, 0) + "%)";
  if (c.without_bar) out += "; " + std::to_string(c.without_bar) + " have no validated case near them";
  return out;
}

// The README's accuracy section: per dataset of the suite, its MAPE (and max lengths) as the baseline's full run
// recorded them, and the error bars' coverage; generated, so it can never drift from what validate measures.
std::string accuracy_summary(const std::string& baseline_path) {
  const Json doc = json::parse(read_input_file(baseline_path, kJsonFileCapBytes, "a baseline JSON file"), baseline_path);
  if (!doc.contains("all")) throw InputError(baseline_path, "all", "the figures of a full run (scripts/validation_doc.sh)", "none");
  std::string out = "MAPE per dataset over every case, as scripts/validation_doc.sh last recorded it:\n";
  for (const auto& d : builtin_validation_suite()) {
    if (!doc["all"].contains(d.name)) throw InputError(baseline_path, "all." + d.name, "the dataset's recorded figures", "none");
    const json::Reader r(doc["all"][d.name], baseline_path, "all." + d.name);
    DatasetScore s;
    s.mape = r.number("mape", {0, 1e9, "", false});
    s.compared = static_cast<int>(r.integer("compared", 0, 1000000));
    s.max_seq_equal = static_cast<int>(r.integer("max_seq_equal", 0, 1000000));
    s.max_seq_total = static_cast<int>(r.integer("max_seq_total", 0, 1000000));
    s.not_simulated = static_cast<int>(r.integer("not_simulated", 0, 1000000));
    out += "- " + d.name + " (" + d.title + "): " + summary_text(s) + ".\n";
  }
  return out + "\nEvery prediction carries an error bar from the published runs nearest it (docs/validation.md, Error bars); " +
         coverage_text(coverage(builtin_error_records())) + ".\n";
}

}  // namespace

// --gpu-profile and --collectives: every case of the user's datasets timed on them (a calibrated profile against
// the user's own runs on that GPU). Not with the built-in suite: its cases span several GPUs and libraries.
void with_calibration(const po::variables_map& vm, std::vector<ValidationDataset>& datasets) {
  for (const char* flag : {"gpu-profile", "collectives"}) {
    if (!vm.count(flag)) continue;
    if (!vm.count("cases")) {
      throw InputError(std::string("--") + flag, "value",
                       "--cases beside it (your runs on the GPU it describes; the built-in suite spans several GPUs)", "no --cases");
    }
    const std::string value = vm[flag].as<std::string>();
    for (auto& d : datasets) {
      for (auto& c : d.cases) {
        if (c.attention && std::string(flag) == "gpu-profile") c.attention->gpu_profile = value;
        if (!c.simulate.empty() && c.simulate.front() != "--collective") c.simulate.insert(c.simulate.end(), {std::string("--") + flag, value});
      }
    }
  }
}

namespace {

po::options_description validate_options() {
  po::options_description options("validate options");
  // clang-format off
  options.add_options()
      ("only", po::value<std::string>()->value_name("name"), "only this dataset, or only cases whose name contains it")
      ("fast", po::bool_switch(), "only the cases marked fast (what CI runs)")
      ("cases", po::value<std::vector<std::string>>()->value_name("path")->composing(), "a dataset file of your own (repeatable); replaces the built-in suite")
      ("baseline", po::value<std::string>()->value_name("path"), "fail (exit 1) when a dataset's MAPE or max-length matches got worse than recorded here")
      ("write-baseline", po::value<std::string>()->value_name("path"), "record this run's figures per dataset (for --fast or all cases)")
      ("write-error-bars", po::value<std::string>()->value_name("path"),
       "record every step case's signed step-time error and what it was (validation/error_bars.json: the error bars of simulate, plan and the GUI)")
      ("accuracy-summary", po::value<std::string>()->value_name("baseline"),
       "print the README's accuracy section from a recorded baseline's full run and the built-in error bars, simulating nothing")
      ("markdown", po::bool_switch(), "print Markdown tables (docs/validation.md is made of them)")
      ("json", po::bool_switch(), "print the results as JSON")
      ("gpu-profile", po::value<std::string>()->value_name("name|path"),
       "with --cases: time every case on this GPU profile (e.g. one calibrate wrote) instead of its node's GPU")
      ("collectives", po::value<std::string>()->value_name("name|path"), "with --cases: the collective library's costs (e.g. one calibrate wrote)");
  // clang-format on
  add_memory_budget_option(options);
  add_farm_options(options, false);
  return options;
}

std::optional<Json> load_baseline(const po::variables_map& vm, const std::string& mode) {
  if (!vm.count("baseline")) return std::nullopt;
  const std::string path = vm["baseline"].as<std::string>();
  const Json doc = json::parse(read_input_file(path, kJsonFileCapBytes, "a baseline JSON file"), path);
  return doc.contains(mode) ? doc[mode] : Json::object();
}

// A share of a dataset's cases (header: the dataset and the reading; items: the cases' indices), predicted here:
// what each rank under mpirun does with rank 0's messages.
PlanFarm::Work case_predictor(const std::vector<ValidationDataset>& datasets, std::int64_t budget) {
  return [&datasets, budget](const Json& header, const std::vector<Json>& items) {
    const auto d = std::find_if(datasets.begin(), datasets.end(), [&](const ValidationDataset& x) { return x.name == header.at("dataset"); });
    if (d == datasets.end()) throw InputError("rank 0's cases", "dataset", "one this rank loaded", header.dump());
    ValidationDataset read = *d;
    for (const auto& reading : d->readings) {
      if (reading.name == header.at("reading")) read = under_reading(*d, reading);
    }
    std::vector<Json> out;
    for (const Json& i : items) out.push_back(case_result_record(run_case(read, read.cases.at(i.get<std::size_t>()), budget)));
    return out;
  };
}

// Which cases this run takes (--fast, --only) and where they are predicted: here, or dealt to the ranks.
struct CaseRunner {
  bool fast = false;
  std::string only;
  std::int64_t budget = 0;
  PlanFarm* ranks = nullptr;
  PlanFarm::Work predict;

  // The cases of `d` (under `reading`, "" for its own) that this run takes, predicted.
  std::vector<CaseResult> run(const ValidationDataset& d, const std::string& reading) const {
    std::vector<Json> chosen;
    for (std::size_t i = 0; i < d.cases.size(); ++i) {
      const ValidationCase& c = d.cases[i];
      if (fast && !c.fast) continue;
      if (!only.empty() && d.name != only && c.name.find(only) == std::string::npos) continue;
      chosen.push_back(i);
    }
    std::vector<CaseResult> results;
    if (ranks == nullptr) {
      for (const Json& i : chosen) {
        throw_if_interrupted();
        results.push_back(run_case(d, d.cases[i.get<std::size_t>()], budget));
      }
      return results;
    }
    for (const auto& r : ranks->deal(Json{{"dataset", d.name}, {"reading", reading}}, chosen, predict)) {
      if (!r) throw Interrupted();
      results.push_back(case_result_from_record(*r, "another rank's case"));
    }
    return results;
  }
};

// After the datasets: the coverage, the files asked for, and the verdict against --baseline (exit 1 when worse).
int finish_validate(const po::variables_map& vm, const std::string& mode, const std::map<std::string, DatasetScore>& scores,
                    const std::vector<ErrorRecord>& records, const Json& out, const std::optional<Json>& baseline) {
  if (vm["json"].as<bool>()) std::cout << out.dump(2) << "\n";
  else std::cout << coverage_text(coverage(records)) << "\n";
  if (vm.count("write-error-bars")) {
    write_file_atomically(vm["write-error-bars"].as<std::string>(), std::string_view(error_records_json(records).dump(2) + "\n"));
  }
  if (vm.count("write-baseline")) write_baseline(vm["write-baseline"].as<std::string>(), mode, scores);
  if (baseline) {
    const auto worse = regressions(*baseline, scores, vm["baseline"].as<std::string>());
    for (const auto& line : worse) std::cerr << "validate: worse than the baseline: " << line << "\n";
    if (!worse.empty()) return 1;
  }
  return 0;
}

}  // namespace

int run_validate(const std::vector<std::string>& args) {
  po::options_description options = validate_options();
  po::positional_options_description positional;
  po::variables_map vm;
  if (parse(args, "trainyard validate [--fast] [--only NAME] [--cases FILE]... [--baseline FILE] [--write-baseline FILE] [--markdown | --json]",
            options, positional, vm)) {
    return 0;
  }
  check_output_flags(vm, {"write-baseline", "write-error-bars"});
  if (vm["markdown"].as<bool>() && vm["json"].as<bool>()) throw InputError("--markdown/--json", "value", "one of them", "both");
  if (vm.count("accuracy-summary")) {
    std::cout << accuracy_summary(vm["accuracy-summary"].as<std::string>());
    return 0;
  }
  const bool fast = vm["fast"].as<bool>();
  const std::string mode = fast ? "fast" : "all";
  const std::optional<Json> baseline = load_baseline(vm, mode);
  std::vector<ValidationDataset> datasets = vm.count("cases") ? load_validation_files(vm["cases"].as<std::vector<std::string>>())
                                                              : builtin_validation_suite();
  with_calibration(vm, datasets);
  const std::int64_t budget = vm.count("memory-budget") ? memory_budget(vm) : 0;
  // Under mpirun, rank 0 runs validate and the other ranks predict its cases (app/plan_farm.hpp). (Every rank
  // loaded the same datasets above.)
  const std::unique_ptr<PlanFarm> ranks = PlanFarm::join(rank_timeout(vm));
  const CaseRunner cases{fast, vm.count("only") ? vm["only"].as<std::string>() : "", budget, ranks.get(), case_predictor(datasets, budget)};
  if (ranks && !ranks->root()) {
    try {
      return ranks->serve_with(cases.predict);
    } catch (const std::exception& e) {
      ranks->abort_after(e);
    }
  }
  std::map<std::string, DatasetScore> scores;
  std::vector<ErrorRecord> records;
  Json out = Json::array();
  for (const auto& d : datasets) {
    std::vector<CaseResult> results = cases.run(d, "");
    if (results.empty()) continue;
    add_speedups(d, results, budget);
    const DatasetScore s = score(results);
    scores[d.name] = s;
    add_error_records(d, results, records);
    // The other readings of what the source leaves unstated (not with --fast: CI holds the dataset's own reading).
    std::vector<ReadingScore> readings;
    for (const auto& reading : fast ? std::vector<ValidationReading>{} : d.readings) {
      readings.push_back({reading, score(cases.run(under_reading(d, reading), reading.name))});
    }
    if (vm["json"].as<bool>()) out.push_back(results_json(d, results, s, readings));
    else if (vm["markdown"].as<bool>()) print_markdown(d, results, s, readings);
    else print_text(d, results, s, readings);
  }
  if (scores.empty()) {
    std::string names;
    for (const auto& d : datasets) names += (names.empty() ? "" : ", ") + d.name;
    throw InputError("--only", "value", "a dataset name (" + names + ") or part of a case name that exists", "\"" + cases.only + "\"");
  }
  return finish_validate(vm, mode, scores, records, out, baseline);
}

}  // namespace trainyard::app
