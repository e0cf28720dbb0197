// The text of the CUDA backend's device-side index check (kernels/cuda/cuda_stream.h, index_error_text): the
// host check's text in core/ops.cpp (embedding, nll_loss), then the line naming the kernel whose check found
// it. Plain host code: runs without a GPU wherever the build has the CUDA backend; the check itself runs in
// tests/probes/sync_cuda_test.cpp.
#include <gtest/gtest.h>

#include <string>

#if defined(AMPSCOPE_WITH_CUDA)
#include "kernels/cuda/cuda_launch.h"
#include "kernels/cuda/cuda_stream.h"
#endif

namespace ampscope {
namespace {

#if defined(AMPSCOPE_WITH_CUDA)
const std::string kWhere =
    "\n(checked on the device by the index check of kernel '{}'; reported at the next host synchronisation, so "
    "later ops may already have been queued)";

std::string where(const std::string& kernel) {
  std::string out = kWhere;
  out.replace(out.find("{}"), 2, kernel);
  return out;
}

TEST(index_check_test, embedding_errors_read_as_the_host_check_and_name_the_kernel) {
  cuda::IndexCheckRecord r;
  r.first_position = 2;
  r.index = 7;
  r.limit = 5;
  r.launch = 3;
  EXPECT_EQ(cuda::index_error_text(Op::embedding, r),
            "embedding: index 7 at position 2 is out of range for 5 embeddings" + where("embedding"));
  r.index = -1;
  r.first_position = 0;
  EXPECT_EQ(cuda::index_error_text(Op::embedding_backward, r),
            "embedding: index -1 at position 0 is out of range for 5 embeddings" + where("embedding_backward"));
}

TEST(index_check_test, nll_errors_read_as_the_host_check_and_name_the_kernel) {
  cuda::IndexCheckRecord r;
  r.first_position = 2;
  r.index = 9;
  r.limit = 4;
  r.launch = 1;
  EXPECT_EQ(cuda::index_error_text(Op::nll_rows, r),
            "nll_loss: target 9 (row 2) is out of bounds for 4 classes" + where("nll_rows"));
  EXPECT_EQ(cuda::index_error_text(Op::nll_backward_rows, r),
            "nll_loss: target 9 (row 2) is out of bounds for 4 classes" + where("nll_backward_rows"));
}

TEST(index_check_test, a_fresh_record_holds_no_error) {
  const cuda::IndexCheckRecord r;
  EXPECT_EQ(r.launch, 0u);
  EXPECT_EQ(r.first_position, cuda::kIndexCheckNone);
}
#else
TEST(index_check_test, needs_the_cuda_backend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace ampscope
