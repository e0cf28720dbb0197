// The consumer's own include/core/tensor.h: the same path as ampscope's core/tensor.h, on purpose.
#pragma once

namespace consumer {
inline constexpr int kOwnTensorHeader = 17;
}
