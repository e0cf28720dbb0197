// The single-process group (its own object, whatever group the program runs under), the factory's choice
// from the launcher's environment, and the NCCL communicator with one rank (skipped without a GPU).
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "tests/distributed/distributed_test_support.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using testing::test_group;

TEST(single_process_group, is_rank_0_of_1_and_leaves_reductions_as_they_are) {
  SingleProcessGroup g;
  EXPECT_EQ(g.name(), "single");
  EXPECT_EQ(g.rank(), 0);
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.describe(), "single, rank 0 of 1");
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64}) {
    Tensor t = from_values({1, -2, 3.5, 0}, {2, 2}, {.dtype = dtype});
    const std::vector<double> before = t.values();
    g.all_reduce(t);
    EXPECT_EQ(t.values(), before) << dtype_name(dtype);
    g.all_reduce(t, ReduceOp::max);
    EXPECT_EQ(t.values(), before) << dtype_name(dtype);
    g.broadcast(t, 0);
    EXPECT_EQ(t.values(), before) << dtype_name(dtype);
  }
  g.barrier();
}

TEST(single_process_group, gathers_and_scatters_by_copying) {
  SingleProcessGroup g;
  const Tensor in = from_values({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor stacked = zeros({1, 2, 3});
  g.all_gather(stacked, in);
  EXPECT_EQ(stacked.values(), in.values());
  Tensor concatenated = zeros({2, 3});
  g.all_gather(concatenated, in);
  EXPECT_EQ(concatenated.values(), in.values());
  Tensor out = zeros({2, 3});
  g.reduce_scatter(out, in);
  EXPECT_EQ(out.values(), in.values());
  Tensor same = in.clone();
  g.reduce_scatter(same, same);  // in place: the output is the input's only part
  EXPECT_EQ(same.values(), in.values());
}

TEST(single_process_group, host_collectives_return_this_processs_bytes) {
  SingleProcessGroup g;
  EXPECT_EQ(g.all_gather_bytes(std::string("a\0b", 3)), std::vector<std::string>{std::string("a\0b", 3)});
  EXPECT_EQ(g.broadcast_bytes("xyz", 0), "xyz");
  EXPECT_THROW_MSG(g.broadcast_bytes("xyz", 1), IndexError, "broadcast_bytes", "single, rank 0 of 1", "root 1");
  EXPECT_THROW_MSG(g.all_reduce(zeros({2, 2}).transpose(0, 1)), ShapeError, "all_reduce (single, rank 0 of 1)",
                   "[2, 2] f32 on cpu", "not contiguous");
}

TEST(single_process_group, connecting_the_cpu_does_nothing_and_a_gpu_needs_one) {
  SingleProcessGroup g;
  g.connect(Device::cpu());
  EXPECT_TRUE(g.connected(Device::cpu()));
  EXPECT_FALSE(g.connected(Device::cuda(0)));
  if (cuda_status().device_count == 0) {
    EXPECT_THROW_MSG(g.connect(Device::cuda(0)), DeviceError, "cuda:0", "not available");
  }
}

TEST(single_process_group, abort_ends_the_process_with_the_code) {
  if (launched_by_mpi()) GTEST_SKIP() << "under mpirun: a death test forks, which MPI processes must not";
  SingleProcessGroup g;
  EXPECT_EXIT(g.abort(7), ::testing::ExitedWithCode(7), "");
}

// ---- the factory ----

TEST(process_group_connect, every_rank_throws_when_one_rank_cannot_connect) {
  ProcessGroup& g = test_group();
  if (cuda_status().device_count > 0) GTEST_SKIP() << "a GPU is present; this checks the GPU-less error";
  // No rank has a GPU here: each throws its own DeviceError, after telling the others (so none waits for
  // rank 0's NCCL id).
  EXPECT_THROW_MSG(g.connect(Device::cuda(0)), DeviceError, "cuda:0", "not available");
  EXPECT_FALSE(g.connected(Device::cuda(0)));
  g.barrier();  // every rank got here: nobody is left waiting in connect
}

TEST(make_process_group, chose_the_group_the_launchers_environment_asks_for) {
  ProcessGroup& g = test_group();  // made by main() with make_process_group()
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (size == nullptr) {
    EXPECT_FALSE(launched_by_mpi());
    EXPECT_EQ(g.name(), "single");
    EXPECT_EQ(g.size(), 1);
    return;
  }
  EXPECT_TRUE(launched_by_mpi());
  EXPECT_EQ(g.name(), mpi_available() ? "mpi" : "single");
  EXPECT_EQ(g.size(), std::atoi(size));
  EXPECT_EQ(g.rank(), std::atoi(rank));
  if (g.name() == "mpi") {
    // One MPI group per process: a second one is refused (MPI starts once).
    EXPECT_THROW_MSG(make_process_group(), Error, "already has an MPI process group", "hint:");
  }
}

TEST(make_process_group, reads_open_mpis_and_pmis_variables) {
  if (launched_by_mpi()) GTEST_SKIP() << "under mpirun: the launcher's variables are set for real";
  EXPECT_FALSE(launched_by_mpi());
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    ::setenv(var, "2", 1);
    EXPECT_TRUE(launched_by_mpi()) << var;
    if (!mpi_available() && std::string(var) != "PMIX_RANK") {
      // Without MPI, a launch with 2 processes is refused (the processes could not talk to each other).
      EXPECT_THROW_MSG(make_process_group(), Error, "2 processes", "no MPI", "AMPSCOPE_MPI=ON");
    }
    ::unsetenv(var);
  }
  EXPECT_FALSE(launched_by_mpi());
  // Not launched: the single-process group, without touching MPI.
  EXPECT_EQ(make_process_group()->name(), "single");
}

// ---- NCCL ----

TEST(nccl_group, one_rank_reduces_broadcasts_and_gathers_cuda_tensors) {
  if (test_group().size() > 1) GTEST_SKIP() << "run by the single-process ctest entry (one GPU, one rank)";
  SKIP_WITHOUT_GPU();
  SingleProcessGroup g;
  g.connect(Device::cuda(0));  // a one-rank NCCL communicator, its id "broadcast" over the single group
  ASSERT_TRUE(g.connected(Device::cuda(0)));
  const TensorOptions on_gpu{.dtype = DType::f16, .device = Device::cuda(0)};
  Tensor t = from_values({1, 2, 65504, -3}, {4}, on_gpu);
  g.all_reduce(t);
  EXPECT_EQ(t.values(), (std::vector<double>{1, 2, 65504, -3}));
  g.all_reduce(t, ReduceOp::max);
  g.broadcast(t, 0);
  EXPECT_EQ(t.values(), (std::vector<double>{1, 2, 65504, -3}));
  Tensor gathered = zeros({1, 4}, on_gpu);
  g.all_gather(gathered, t);
  EXPECT_EQ(gathered.values(), t.values());
  Tensor scattered = zeros({4}, on_gpu);
  g.reduce_scatter(scattered, gathered);
  EXPECT_EQ(scattered.values(), t.values());
}

TEST(nccl_group, every_rank_with_its_own_gpu_sums_cuda_tensors) {
  ProcessGroup& g = test_group();
  if (g.size() < 2) GTEST_SKIP() << "needs two ranks or more (the mpirun ctest entries)";
  // Every rank decides the same way (the same machine), so either all skip or all connect.
  const CudaStatus status = cuda_status();
  if (status.device_count < g.size()) {
    GTEST_SKIP() << "needs one GPU per rank: " << g.size() << " ranks, "
                 << (status.device_count == 0 ? "no usable CUDA device: " + status.reason
                                              : std::to_string(status.device_count) + " GPU(s)");
  }
  g.connect(Device::cuda(g.rank()));
  Tensor t = full({1000}, g.rank() + 1.0, {.dtype = DType::f32, .device = Device::cuda(g.rank())});
  g.all_reduce(t);
  const double expected = g.size() * (g.size() + 1) / 2.0;
  for (double v : t.values()) ASSERT_EQ(v, expected);
}

}  // namespace
}  // namespace ampscope
