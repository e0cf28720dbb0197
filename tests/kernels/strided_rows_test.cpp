// The CPU backend's strided element-wise loops walk a view row by row (kernels/cpu/elementwise.h,
// for_each_row) with a plain inner loop per row. They must give exactly the bits of the element-by-element
// definition: out[i] = convert<T>(Fn(convert<float>(x[offset_of(i)]), convert<float>(y[offset_of(i)]))),
// computed here independently from TensorView::offset_of, for broadcasts (0-dim, row, column), transposed
// and sliced views, and sizes whose parallel chunks start in the middle of a row; inputs hold NaN,
// infinities, subnormals and signed zeros.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/functors.h"

namespace ampscope {
namespace {

// A random f32 tensor with the edge cases planted every 97 elements.
Tensor with_edge_cases(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(shape, gen);
  const float inf = std::numeric_limits<float>::infinity();
  const float cases[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f,
                         std::numeric_limits<float>::denorm_min(), -1e-40f, 3e38f};
  float* p = static_cast<float*>(t.data());
  for (std::int64_t i = 0, k = 0; i < t.numel(); i += 97, ++k) p[i] = cases[k % std::size(cases)];
  return t;
}

float element(const Tensor& view, std::int64_t linear) {
  const TensorView v = view.kernel_view();
  return static_cast<const float*>(v.data)[v.offset_of(linear)];
}

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

template <class Fn>
void expect_binary_matches_definition(const Tensor& x, const Tensor& y, const Tensor& got, const std::string& what) {
  ASSERT_TRUE(got.is_contiguous()) << what;
  const Tensor xe = x.expand(got.shape()), ye = y.expand(got.shape());
  const float* out = static_cast<const float*>(got.data());
  int wrong = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const float expected = Fn{}(element(xe, i), element(ye, i));
    if (bits(out[i]) != bits(expected) && wrong++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " got " << out[i] << " expected " << expected;
    }
  }
  EXPECT_EQ(wrong, 0) << what;
}

// 301 x 457 = 137557 elements: several parallel chunks, none starting at a row boundary.
constexpr std::int64_t kRows = 301, kCols = 457;

TEST(strided_rows_test, binary_ops_on_broadcast_and_strided_views_match_the_element_by_element_definition) {
  const Tensor a = with_edge_cases({kRows, kCols}, 1);
  const Tensor at = with_edge_cases({kCols, kRows}, 2).transpose(0, 1);                 // [rows, cols], transposed
  const Tensor sliced = with_edge_cases({kRows, 2 * kCols}, 3).slice(1, 1, 2 * kCols, 2);  // column stride 2
  const Tensor scalar = with_edge_cases({}, 4);
  const Tensor row = with_edge_cases({kCols}, 5);
  const Tensor col = with_edge_cases({kRows, 1}, 6);
  const Tensor coef = full({}, 0.5, {DType::f32});
  struct Case {
    Tensor x, y;
    const char* name;
  };
  const Case cases[] = {{a, coef, "x * 0-dim"},        {coef, a, "0-dim * x"},           {a, row, "x with a row"},
                        {row, a, "a row with x"},      {a, col, "x with a column"},      {col, row, "column with row"},
                        {at, a, "transposed with x"},  {a, at, "x with transposed"},     {sliced, at, "sliced with transposed"},
                        {at, scalar, "transposed with a 0-dim"}};
  for (const Case& c : cases) {
    expect_binary_matches_definition<AddFn>(c.x, c.y, add(c.x, c.y), std::string("add, ") + c.name);
    expect_binary_matches_definition<SubFn>(c.x, c.y, sub(c.x, c.y), std::string("sub, ") + c.name);
    expect_binary_matches_definition<MulFn>(c.x, c.y, mul(c.x, c.y), std::string("mul, ") + c.name);
    expect_binary_matches_definition<DivFn>(c.x, c.y, div(c.x, c.y), std::string("div, ") + c.name);
  }
}

TEST(strided_rows_test, unary_scalar_and_copy_on_strided_views_match_the_element_by_element_definition) {
  const Tensor at = with_edge_cases({kCols, kRows}, 7).transpose(0, 1);
  const Tensor sliced = with_edge_cases({kRows, 2 * kCols}, 8).slice(1, 1, 2 * kCols, 2);
  for (const Tensor& x : {at, sliced}) {
    const Tensor s = sqrt(x), m = mul(x, 3.0), c = x.contiguous();
    Tensor into_transposed = Tensor::empty({kCols, kRows}, {DType::f32});
    into_transposed.transpose(0, 1).copy_(x);  // a strided destination
    const float* sp = static_cast<const float*>(s.data());
    const float* mp = static_cast<const float*>(m.data());
    const float* cp = static_cast<const float*>(c.data());
    const float* tp = static_cast<const float*>(into_transposed.data());
    int wrong = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const float v = element(x, i);
      const std::int64_t r = i / kCols, k = i % kCols;
      const bool ok = bits(sp[i]) == bits(SqrtFn{}(v)) && bits(mp[i]) == bits(MulFn{}(v, 3.0f)) &&
                      bits(cp[i]) == bits(v) && bits(tp[k * kRows + r]) == bits(v);
      if (!ok && wrong++ < 5) ADD_FAILURE() << "element " << i << " (value " << v << ")";
    }
    EXPECT_EQ(wrong, 0);
  }
}

// Transposed matrices (with a batch dimension in front, sizes not multiples of the copy's tiles) made
// contiguous: every element where index arithmetic puts it.
TEST(strided_rows_test, transposed_copies_put_every_element_where_index_arithmetic_says) {
  for (const Shape& shape : {Shape{kCols, kRows}, Shape{3, 45, 70}, Shape{2, 5, 33}}) {
    const Tensor base = with_edge_cases(shape, 9);
    const std::int64_t nd = static_cast<std::int64_t>(shape.size());
    const Tensor view = base.transpose(nd - 2, nd - 1);
    const Tensor dense = view.contiguous();
    Tensor into = Tensor::empty(view.shape(), {DType::f32});
    into.copy_(view);
    const std::int64_t r = shape[nd - 1], c = shape[nd - 2];  // the view is [..., r, c]
    const float* src = static_cast<const float*>(base.data());
    const float* d = static_cast<const float*>(dense.data());
    const float* i2 = static_cast<const float*>(into.data());
    int wrong = 0;
    for (std::int64_t i = 0; i < dense.numel(); ++i) {
      const std::int64_t m = i / (r * c), row = i / c % r, col = i % c;
      const float expected = src[m * r * c + col * r + row];  // base[m][col][row]
      if ((bits(d[i]) != bits(expected) || bits(i2[i]) != bits(expected)) && wrong++ < 5) {
        ADD_FAILURE() << "element " << i << " of a transposed " << dense.numel() << "-element copy";
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

}  // namespace
}  // namespace ampscope
