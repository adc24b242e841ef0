#pragma once
// HotSPa's mini-batch with real tensors (seed 004; the simulated side is planner/hotspa.hpp): each length group's
// step runs under its own strategy on the executor, gradients accumulate across the groups, and the model is
// updated once, in the last group's ("home") layout. Between the groups the parameters and the accumulated
// gradients move from one group's layout to the next by the seed's Algorithm 1 (planner::plan_switch), as
// messages between the ranks: the switches are executed, not assumed.
//
// Layouts here are the executor's: a group's step keeps each parameter group on the GPUs that use it, each its
// tensor-parallel slice (executor_layout). For ZeRO-3 this is the whole model on every GPU, where the plan's
// layout (planner::parameter_layout) has 1/N each: the executors keep whole weights resident (executor.hpp), so the
// executed switch can move more than the simulated one. Both are reported (HotSpaStepResult).
//
// What a rank does not hold is NaN: the weights outside its home slices before each mini-batch, the accumulated
// gradients outside its slices of the current layout. A slice a switch failed to deliver then poisons the step that
// reads it (the executor refuses a loss that is not finite) or the gradients, which the checks see.
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/communicator.hpp"
#include "backend/device.hpp"
#include "backend/model_state.hpp"
#include "kernels/reference.hpp"
#include "planner/switching.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// The units of the executor's layouts: ModelState's parameter groups in all() order (layers 0..L-1, the
// embedding, the head: the final norm and, untied, the LM head). The planner's units differ only there: with tied
// embeddings it has no head unit (the final norm is too small to count).
std::vector<int> layout_units(const model::ModelConfig& model);
// Where `graph`'s executor keeps each unit: the GPUs that use it (backend/parameter_groups.hpp: its forward's, and
// with tied embeddings the LM head's for the embedding), GPU g holding the slice [k/t, (k+1)/t) for k = g mod t
// under tensor parallelism of t (the executor's shard index).
planner::StateLayout executor_layout(const sim::TaskGraph& graph, const model::ModelConfig& model);
// Everything on GPU 0 (where --check gathers the result).
planner::StateLayout gathered_layout(const model::ModelConfig& model);
// Bytes of each unit at `bytes_per_element`, in layout_units order (plan_switch's unit sizes).
std::vector<std::int64_t> layout_unit_bytes(const model::ModelConfig& model, double bytes_per_element);

enum class SwitchedValues { weights, gradients };
// Runs `plan` (whose units are layout_units) on this rank's `state`: each transfer's slice (tensor_slice_layouts) of
// the unit's parameters, sent by its source and written over the destination's values. Transfers run in plan order
// on every rank (sends return at once: Communicator::send), so the order is the same everywhere and nothing waits
// in a cycle. One rank (`comm` null): the plan must be empty. Returns the bytes this rank sent (fp32 values).
std::int64_t run_switch(ModelState& state, const planner::SwitchPlan& plan, SwitchedValues which, Communicator* comm);
// Sets `which` to NaN outside the slices `layout` gives GPU `rank`.
void poison_unheld(ModelState& state, const planner::StateLayout& layout, int rank, SwitchedValues which);

struct HotSpaGroupRun {
  const sim::TaskGraph* graph = nullptr;              // the group's step without the optimizer (planner::minibatch_groups)
  std::span<const std::vector<std::int32_t>> tokens;  // its rows, seq_len + 1 ids each
};
struct HotSpaStepResult {
  double loss = 0;  // mean cross-entropy over all the groups' tokens
  std::int64_t tokens = 0;
  std::vector<std::int64_t> group_step_ns;  // each group's measured step on this rank's device
  std::int64_t switch_ns = 0;               // the switches' wall time on this rank
  // Bytes every rank sent in the switches (summed over the ranks), executed, and as plan_switch sizes them at
  // the executors' layouts with bf16 weights and fp32 gradients.
  std::int64_t sent_bytes = 0, planned_param_bytes = 0, planned_grad_bytes = 0;
};

struct HotSpaOptions {
  bool update = true;  // AdamW on the home layout after the last group (else the accumulated gradients are left)
  kernels::AdamW adam;
  Communicator* comm = nullptr;  // several ranks: one per GPU of the graphs (all of the same cluster)
  std::chrono::milliseconds comm_timeout{300000};
};

// One mini-batch on this rank. `state` holds this rank's home slices (and, before the first mini-batch, the seeded
// model everywhere); after it, the updated home slices and, in `grad`, the accumulated gradient on them (NaN
// elsewhere). Each group's executor is built when its turn comes and freed after, as one group's memory at a time.
HotSpaStepResult run_hotspa_step(Device& device, std::span<const HotSpaGroupRun> groups, ModelState& state, int gpus_per_node, int optimizer_step,
                                 const HotSpaOptions& options);

// After a mini-batch on several ranks: the accumulated gradients and the weights of the home layout (`home`: the last
// group's executor_layout) gathered to rank 0 by one more switch, so that rank 0 holds what a single-rank run would.
// Every rank calls it.
void gather_switched(ModelState& state, const planner::StateLayout& home, int gpus_per_node, Communicator& comm);

// The same mini-batch on one rank with the CPU reference executor (every GPU's tasks here): `groups[k].graph` runs
// group k's tokens (e.g. the unchunked step of its rows), the gradients summed weighted by tokens, one AdamW step on every
// group when `update`. Returns the loss.
double hotspa_reference_step(std::span<const HotSpaGroupRun> groups, ModelState& state, int gpus_per_node, int optimizer_step, bool update,
                             const kernels::AdamW& adam);

}  // namespace trainyard::backend
