// killed_rank: a program for killed_rank_test.sh, run under mpirun with 2 ranks or more. Every rank joins one
// all_reduce; then, by the mode given:
//   die    rank 1 ends at once without MPI_Finalize (std::_Exit(0)): a crash, a kill, an OOM kill;
//   leave  rank 1 destroys its process group and returns, as a rank whose error main caught would;
//   clean  every rank makes one more all_reduce and ends normally (the control: exit status 0).
// In die and leave, the other ranks wait in a second all_reduce that can never complete: the job must
// still end, with a non-zero status, in bounded time (killed_rank_test.sh checks that).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/distributed/process_group.h"
#include "core/tensor.h"

int main(int argc, char** argv) {
  using namespace ampscope;
  if (argc != 2 || (std::strcmp(argv[1], "die") != 0 && std::strcmp(argv[1], "leave") != 0 &&
                    std::strcmp(argv[1], "clean") != 0)) {
    std::fprintf(stderr, "usage: mpirun -np 2 killed_rank die|leave|clean\n");
    return 2;
  }
  const std::string mode = argv[1];
  try {
    ProcessGroupOptions options;
    options.shutdown_timeout_s = 2;  // "leave": the job is aborted 2 s after rank 1 leaves
    std::unique_ptr<ProcessGroup> group = make_process_group(options);
    Tensor t = full({16}, group->rank() + 1.0);
    group->all_reduce(t);
    std::printf("rank %d: first all_reduce done (%g)\n", group->rank(), t.values()[0]);
    std::fflush(stdout);
    if (group->rank() == 1 && mode == "die") std::_Exit(0);
    if (group->rank() == 1 && mode == "leave") {
      group.reset();
      return 0;
    }
    group->all_reduce(t);
    std::printf("rank %d: second all_reduce done (%g)\n", group->rank(), t.values()[0]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "killed_rank: %s\n", e.what());
    return 1;
  }
}
