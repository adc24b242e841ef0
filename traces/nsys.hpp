#pragma once
// Nsight Systems SQLite exports (`nsys export --type sqlite`), one file per rank, read into the same RankTrace the
// Kineto reader fills (traces/kineto.hpp), so that `trainyard compare` treats both alike. Opened read-only through
// libsqlite3; every table and column read is looked up first (sqlite_master, pragma table_info), so that exports of
// older Nsight Systems versions read too and a missing one is an error naming the file, the table and the column.
//
// Kept:
//   - GPU work: CUPTI_ACTIVITY_KIND_KERNEL (demangledName, else shortName, through StringIds), _MEMCPY (copyKind:
//     1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, anything else "other") and _MEMSET, with deviceId and streamId. A table that
//     is absent holds no events of its kind (Nsight Systems creates tables lazily).
//   - Steps: NVTX_EVENTS ranges named "ProfilerStep#N" (torch.profiler, Megatron), on the host. The GPU's step spans
//     are projected from them (see read_nsys_file).
//   - Collectives: an NCCL kernel (ncclKernel*, ncclDevKernel*) gets the NVTX range enclosing the CUDA runtime call
//     that launched it (CUPTI_ACTIVITY_KIND_RUNTIME, joined on the process and correlationId) on the launching
//     thread: NCCL's own ("ncclAllReduce", ...) or PyTorch's ("nccl:all_reduce", ...), innermost first. The size is
//     NCCL's payload as Nsight Systems renders it in NVTX_EVENTS.jsonText / jsonTextId ("Message size [bytes]", or
//     "Bytes" for send and recv); older exports have no rendering and the size stays 0 (unknown). NCCL's size is
//     per rank: for all-gather and reduce-scatter, the chunk of one rank (Kineto's is the whole buffer).
//   - The rank: the trailing integer of the file's stem ("trace_rank3.sqlite" -> 3), else -1.
// Left out: every other NVTX range, OS runtime, CPU sampling, the export's metadata. A file is one process: an
// export of several ranks in one file reads as one rank.
#include <string>
#include <vector>

#include "traces/kineto.hpp"

namespace trainyard::traces {

// One export. The GPU's step spans (RankTrace::gpu_steps) are projected from the host's ProfilerStep ranges: a
// step's span runs from the first start to the last end of the GPU work whose launching runtime call started inside
// the host range, as Kineto's gpu_user_annotation spans do. InputError naming the file (and the table and column) for
// a file that is not SQLite, a corrupt one, or a table without a column it needs. Stops with trainyard::Interrupted
// on Ctrl-C.
RankTrace read_nsys_file(const std::string& path);
// A file, or every *.sqlite file of a directory (one per rank), ordered by rank, then name.
std::vector<RankTrace> read_nsys(const std::string& path);
// The files read_nsys reads: `path` itself, or a directory's *.sqlite by name (InputError for none).
std::vector<std::string> nsys_files(const std::string& path);
// A file that starts with SQLite's 16-byte magic ("SQLite format 3\0"), or a directory holding *.sqlite files.
bool looks_like_sqlite(const std::string& path);

}  // namespace trainyard::traces
