// Trains a linear layer for a few SGD steps with ampscope as a subproject, and includes a core/tensor.h
// of its own beside ampscope's <ampscope/core/tensor.h>. Prints the loss before and after.
#include <cstdio>

#include "core/tensor.h"  // the consumer's own

#include <ampscope/core/nn.h>
#include <ampscope/core/ops.h>
#include <ampscope/core/optim.h>

#if __has_include("kernels/functors.h")
#error "ampscope's source tree is on the include path of an add_subdirectory consumer"
#endif

static_assert(consumer::kOwnTensorHeader == 17, "core/tensor.h is not the consumer's own");

int main() {
  using namespace ampscope;
  Generator gen(0);
  nn::Linear layer(4, 1, gen);
  optim::SGD opt(layer.parameters(), {.lr = 0.1});
  const Tensor x = randn({16, 4}, gen);
  const Tensor y = zeros({16, 1});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    const Tensor loss = mse_loss(layer(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("loss %g -> %g\n", first, last);
  return last < first ? 0 : 1;
}
