// tests/core/tensor_test.cpp: the Tensor handle of core/tensor.h: creation, strides and views, copies and
// dtype casts, element access, devices, errors and printing (core/format.h).
//
// Where the expected values come from:
//   * shapes, strides, offsets and element values of views: worked out by hand in the comments (row-major
//     layout: the element [i][j] of a contiguous [R, C] tensor sits at i * C + j);
//   * f16 rounding: g++'s host `_Float16` (IEEE round-to-nearest-even), which shares no code with
//     core/float16.h; f64 values reach f16 through float (PyTorch's rule), so the reference is
//     (_Float16)(float)x;
//   * printing: strings written out by hand from the rules in core/format.cpp (shortest text that reads
//     back to the same value in the dtype, whole numbers as "3.", right-aligned to the widest cell);
//   * error messages: the parts the contract promises (op, index, dimension, shapes, hint).
#include "core/tensor.h"

#include <gtest/gtest.h>

#include "tests/test_support.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/format.h"

namespace {

using ampscope::arange;
using ampscope::Device;
using ampscope::DType;
using ampscope::from_values;
using ampscope::full;
using ampscope::ones;
using ampscope::Shape;
using ampscope::Tensor;
using ampscope::zeros;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Reference f16 rounding of a double as PyTorch does it (through float), by the compiler's _Float16.
double f16_ref(double x) { return static_cast<double>(static_cast<_Float16>(static_cast<float>(x))); }

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// Compares element by element (NaN equals NaN, zero signs must match); on failure prints how many differ
// and the first few (index, reference, actual).
void expect_values(const std::vector<double>& actual, const std::vector<double>& reference, const std::string& what) {
  ASSERT_EQ(actual.size(), reference.size()) << what << ": element count";
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (same_value(actual[i], reference[i])) continue;
    if (bad < 5) first += fmt::format("\n  [{}] reference {} actual {}", i, reference[i], actual[i]);
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << actual.size() << " elements differ; first:" << first;
}

std::vector<double> iota(std::size_t n, double start = 0.0) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i);
  return v;
}

// ---- creation and layout ------------------------------------------------------------------------

TEST(tensor_test, new_tensors_are_contiguous_with_row_major_strides) {
  const Tensor t = zeros({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));  // 3 * 4, 4, 1
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.dtype(), DType::f32);  // the default, as torch.get_default_dtype()
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.storage_offset(), 0);
  expect_values(t.values(), std::vector<double>(24, 0.0), "zeros");
  expect_values(ones({2, 2}, {.dtype = DType::bf16}).values(), std::vector<double>(4, 1.0), "ones bf16");
  expect_values(full({3}, 0.1, {.dtype = DType::f16}).values(), std::vector<double>(3, f16_ref(0.1)), "full f16 0.1");
}

TEST(tensor_test, size_of_a_dimension_out_of_range_names_the_valid_range) {
  const Tensor t = zeros({2, 3});
  EXPECT_THROW_MSG(t.size(2), ampscope::IndexError, "size", "dimension 2", "[2, 3]", "-2 to 1");
}

TEST(tensor_test, a_zero_dimensional_tensor_holds_one_element) {
  const Tensor s = from_values({2.5}, {}, {.dtype = DType::f16});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 2.5);
  EXPECT_EQ(s.at({}), 2.5);
}

TEST(tensor_test, negative_sizes_and_too_many_dimensions_are_shape_errors) {
  EXPECT_THROW_MSG((zeros({2, -1})), ampscope::ShapeError, "negative size", "[2, -1]");
  EXPECT_THROW_MSG((zeros({1, 1, 1, 1, 1, 1, 1, 1, 1})), ampscope::ShapeError, "[1, 1, 1, 1, 1, 1, 1, 1, 1]",
                   "9 dimensions", "at most 8");
}

TEST(tensor_test, from_values_rounds_f64_to_f16_through_float) {
  // 1 + 2^-11 + 2^-40: rounded directly to f16 it goes up to 1 + 2^-10, but through float it is the
  // exact tie 1 + 2^-11, which rounds to the even 1.0 (see dtype_test for the derivation).
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  const std::vector<double> in = {d, 0.1, 65519.999999, 70000.0, -1e-8, 1.0 / 3.0};
  std::vector<double> ref;
  for (double x : in) ref.push_back(f16_ref(x));
  expect_values(from_values(in, {6}, {.dtype = DType::f16}).values(), ref, "from_values f16");
  EXPECT_EQ(ref[0], 1.0);
}

TEST(tensor_test, from_values_with_the_wrong_count_names_both_counts_and_the_shape) {
  EXPECT_THROW_MSG((from_values({1, 2, 3}, {2, 2})), ampscope::ShapeError, "from_values", "3 values", "[2, 2]", "4");
}

TEST(tensor_test, storage_allocates_on_the_backend_of_its_device) {
  ampscope::Storage s(ampscope::backend_for(Device::cpu()), 24);
  EXPECT_EQ(s.nbytes(), 24u);
  EXPECT_EQ(s.device(), Device::cpu());
  EXPECT_EQ(s.backend().name(), "cpu");
  EXPECT_NE(s.data(), nullptr);
}

TEST(tensor_test, an_undefined_tensor_says_so) {
  const Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW_MSG(t.shape(), ampscope::Error, "undefined tensor");
  EXPECT_EQ(t.to_string(), "tensor(undefined)");
}

TEST(tensor_test, data_as_with_the_wrong_type_names_both_dtypes) {
  const Tensor t = zeros({2}, {.dtype = DType::f16});
  EXPECT_NE(t.data_as<ampscope::f16>(), nullptr);
  EXPECT_THROW_MSG(t.data_as<float>(), ampscope::DTypeError, "f16", "cpu", "f32");
}

// ---- arange -------------------------------------------------------------------------------------

TEST(tensor_test, arange_counts_ceil_of_span_over_step) {
  // torch.arange(0, 1, 0.25) = [0, 0.25, 0.5, 0.75]: ceil((1 - 0) / 0.25) = 4, the end is excluded.
  expect_values(arange(0, 1, 0.25).values(), {0, 0.25, 0.5, 0.75}, "arange(0, 1, 0.25)");
  // ceil(1 / 0.3) = ceil(3.33) = 4 elements: 0, 0.3, 0.6, 0.9 (each rounded to f32).
  expect_values(arange(0, 1, 0.3).values(),
                {0.0, static_cast<double>(0.3f), static_cast<double>(0.6f), static_cast<double>(0.9f)},
                "arange(0, 1, 0.3)");
  expect_values(arange(5).values(), {0, 1, 2, 3, 4}, "arange(5)");
  expect_values(arange(5, 0, -1).values(), {5, 4, 3, 2, 1}, "arange(5, 0, -1)");
  expect_values(arange(0, 10, 3, {.dtype = DType::i64}).values(), {0, 3, 6, 9}, "arange i64");
  EXPECT_EQ(arange(2, 2, 1).numel(), 0);
  EXPECT_EQ(arange(0, 1, 0.25).dtype(), DType::f32);
}

TEST(tensor_test, arange_in_f16_rounds_each_value_to_nearest_even) {
  // f16 spacing is 2 in [2048, 4096): 2049 ties to the even 2048, 2051 to the even 2052.
  const Tensor t = arange(2040, 2060, 1, {.dtype = DType::f16});
  std::vector<double> ref;
  for (int i = 2040; i < 2060; ++i) ref.push_back(f16_ref(i));
  expect_values(t.values(), ref, "arange f16");
  EXPECT_EQ(t.at({9}), 2048.0);   // 2049
  EXPECT_EQ(t.at({11}), 2052.0);  // 2051
}

TEST(tensor_test, arange_with_a_zero_or_non_finite_step_or_wrong_direction_throws) {
  EXPECT_THROW_MSG(arange(0, 1, 0), ampscope::Error, "arange", "step", "non-zero", "step=0");
  EXPECT_THROW_MSG(arange(0, kInf, 1), ampscope::Error, "arange", "finite");
  EXPECT_THROW_MSG(arange(0, std::nan(""), 1), ampscope::Error, "arange", "finite");
  EXPECT_THROW_MSG(arange(0, 10, -1), ampscope::Error, "arange", "step -1", "end 10", "start 0");
  EXPECT_THROW_MSG(arange(10, 0, 1), ampscope::Error, "arange", "step 1", "end 0", "start 10");
}

// ---- view and reshape ---------------------------------------------------------------------------

TEST(tensor_test, view_infers_one_minus_one_dimension_and_shares_storage) {
  const Tensor a = arange(24);
  const Tensor v = a.view({4, -1});
  EXPECT_EQ(v.shape(), (Shape{4, 6}));  // 24 / 4
  EXPECT_EQ(v.strides(), (Shape{6, 1}));
  EXPECT_TRUE(v.shares_storage_with(a));
  const Tensor r = a.reshape({-1, 2, 3});
  EXPECT_EQ(r.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(r.strides(), (Shape{6, 3, 1}));
  EXPECT_TRUE(r.shares_storage_with(a));
  EXPECT_EQ(r.at({3, 1, 2}), 23.0);  // 3 * 6 + 1 * 3 + 2
}

TEST(tensor_test, view_and_reshape_reject_two_minus_ones_and_wrong_counts) {
  const Tensor a = arange(24);
  EXPECT_THROW_MSG((a.view({-1, -1})), ampscope::ShapeError, "view", "only one dimension can be -1", "[-1, -1]");
  EXPECT_THROW_MSG((a.reshape({5, 5})), ampscope::ShapeError, "reshape", "[24]", "24 elements", "[5, 5]",
                   "25 elements");
  EXPECT_THROW_MSG((a.view({5, -1})), ampscope::ShapeError, "view", "[24]", "[5, -1]");
  EXPECT_THROW_MSG((a.view({-2, 12})), ampscope::ShapeError, "view", "-2", "[-2, 12]");
}

TEST(tensor_test, reshape_of_a_contiguous_tensor_shares_storage) {
  const Tensor a = arange(6).reshape({2, 3});
  const Tensor r = a.reshape({3, 2});
  EXPECT_TRUE(r.shares_storage_with(a));
  // A write through the reshaped tensor is seen by the original: element 5 is [1][2] in a, [2][1] in r.
  Tensor w = r;
  w.set({2, 1}, 50.0);
  EXPECT_EQ(a.at({1, 2}), 50.0);
}

TEST(tensor_test, reshape_of_a_transposed_tensor_copies_in_row_major_order_of_the_view) {
  // a = [[0, 1, 2], [3, 4, 5]]; a^T = [[0, 3], [1, 4], [2, 5]], whose row-major order is 0 3 1 4 2 5.
  const Tensor t = arange(6).reshape({2, 3}).transpose(0, 1);
  const Tensor r = t.reshape({6});
  EXPECT_FALSE(r.shares_storage_with(t));
  EXPECT_TRUE(r.is_contiguous());
  expect_values(r.values(), {0, 3, 1, 4, 2, 5}, "reshape of transpose");
}

TEST(tensor_test, view_of_a_non_viewable_tensor_throws_with_a_hint) {
  // a^T has shape [3, 2] and strides [1, 3]: its row-major order (0 3 1 4 2 5) is not one stride apart.
  const Tensor t = arange(6).reshape({2, 3}).transpose(0, 1);
  EXPECT_THROW_MSG((t.view({6})), ampscope::ShapeError, "view", "[3, 2]", "[1, 3]", "[6]", "without a copy", "hint:",
                   "reshape()", "contiguous()");
}

TEST(tensor_test, view_of_a_transposed_tensor_can_split_or_add_unit_dimensions) {
  // t = a^T, shape [3, 2], strides [1, 3]. Splitting a dimension or adding a size-1 one needs no copy:
  // [3, 2] -> [3, 1, 2] keeps strides 1 and 3 for the real dimensions.
  const Tensor t = arange(6).reshape({2, 3}).transpose(0, 1);
  const Tensor v = t.view({3, 1, 2});
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_EQ(v.strides()[0], 1);
  EXPECT_EQ(v.strides()[2], 3);
  expect_values(v.values(), {0, 3, 1, 4, 2, 5}, "view [3, 1, 2]");
  // b = arange(12) as [4, 3] transposed: shape [3, 4], strides [1, 3]. Splitting the 4 (stride 3) into
  // [2, 2] gives strides 6 and 3.
  const Tensor b = arange(12).reshape({4, 3}).transpose(0, 1);
  const Tensor w = b.view({3, 2, 2});
  EXPECT_EQ(w.strides(), (Shape{1, 6, 3}));
  EXPECT_EQ(w.at({2, 1, 0}), 8.0);  // b[2][2] = a[2][2] = 2 * 3 + 2
}

// ---- transpose, permute, slice, expand ----------------------------------------------------------

TEST(tensor_test, transpose_is_a_view_that_shares_storage) {
  const Tensor a = arange(6).reshape({2, 3});
  const Tensor t = a.transpose(0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.shares_storage_with(a));
  EXPECT_EQ(t.at({2, 1}), 5.0);  // a[1][2]
  expect_values(t.values(), {0, 3, 1, 4, 2, 5}, "transpose values");
  const Tensor n = a.transpose(-1, -2);
  EXPECT_EQ(n.strides(), (Shape{1, 3}));
  EXPECT_THROW_MSG(a.transpose(0, 2), ampscope::IndexError, "transpose", "dimension 2", "[2, 3]");
}

TEST(tensor_test, permute_reorders_sizes_and_strides) {
  // a = arange(24) as [2, 3, 4], strides [12, 4, 1]. permute({2, 0, 1}) has shape [4, 2, 3] and strides
  // [1, 12, 4]; p[i][j][k] = a[j][k][i] = 12 j + 4 k + i.
  const Tensor a = arange(24).reshape({2, 3, 4});
  const Tensor p = a.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  std::vector<double> ref;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) ref.push_back(12 * j + 4 * k + i);
  expect_values(p.values(), ref, "permute values");
  EXPECT_EQ(a.permute({-1, 0, 1}).shape(), (Shape{4, 2, 3}));
  EXPECT_THROW_MSG((a.permute({0, 0, 1})), ampscope::ShapeError, "permute", "appears twice", "[0, 0, 1]");
  EXPECT_THROW_MSG((a.permute({0, 1})), ampscope::ShapeError, "permute", "[0, 1]", "[2, 3, 4]");
}

TEST(tensor_test, slice_with_negative_bounds_and_a_step_follows_python) {
  // x[-7:-1:2] of arange(10): start 10 - 7 = 3, end 10 - 1 = 9, so 3, 5, 7.
  const Tensor x = arange(10);
  const Tensor s = x.slice(0, -7, -1, 2);
  EXPECT_EQ(s.shape(), (Shape{3}));
  EXPECT_EQ(s.strides(), (Shape{2}));
  EXPECT_EQ(s.storage_offset(), 3);
  EXPECT_TRUE(s.shares_storage_with(x));
  expect_values(s.values(), {3, 5, 7}, "x[-7:-1:2]");
  // Bounds are clamped: x[2:100] is 2..9; x[8:2] is empty; x[-100:2] is 0, 1.
  expect_values(x.slice(0, 2, 100).values(), iota(8, 2), "x[2:100]");
  EXPECT_EQ(x.slice(0, 8, 2).numel(), 0);
  expect_values(x.slice(0, -100, 2).values(), {0, 1}, "x[-100:2]");
  // x[1:10:3] = 1, 4, 7: ceil((10 - 1) / 3) = 3 elements.
  expect_values(x.slice(0, 1, 10, 3).values(), {1, 4, 7}, "x[1:10:3]");
}

TEST(tensor_test, slice_of_an_inner_dimension_keeps_outer_strides) {
  // a = arange(12) as [3, 4]; a[:, 1:4:2] is columns 1 and 3: [[1, 3], [5, 7], [9, 11]], strides [4, 2],
  // starting at element 1.
  const Tensor a = arange(12).reshape({3, 4});
  const Tensor s = a.slice(1, 1, 4, 2);
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_EQ(s.strides(), (Shape{4, 2}));
  EXPECT_EQ(s.storage_offset(), 1);
  expect_values(s.values(), {1, 3, 5, 7, 9, 11}, "a[:, 1:4:2]");
  // A row slice of that slice: a[:, 1:4:2][-1:] starts at element 1 + 2 * 4 = 9.
  EXPECT_EQ(s.slice(0, -1, 3).storage_offset(), 9);
}

TEST(tensor_test, slice_with_a_non_positive_step_is_an_index_error) {
  EXPECT_THROW_MSG(arange(10).slice(0, 0, 10, 0), ampscope::IndexError, "slice", "step", "0");
  EXPECT_THROW_MSG(arange(10).slice(0, 0, 10, -1), ampscope::IndexError, "slice", "step", "-1");
  EXPECT_THROW_MSG(arange(10).slice(1, 0, 10), ampscope::IndexError, "slice", "dimension 1", "[10]");
}

TEST(tensor_test, expand_gives_broadcast_dimensions_stride_zero) {
  // c = [[1], [2], [3]] (shape [3, 1], strides [1, 1]) expanded to [2, 3, 4]: the new leading dimension
  // and the size-1 dimension get stride 0; element [i][j][k] is c[j][0] = j + 1.
  const Tensor c = from_values({1, 2, 3}, {3, 1});
  const Tensor e = c.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_TRUE(e.shares_storage_with(c));
  std::vector<double> ref;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) ref.push_back(j + 1);
  expect_values(e.values(), ref, "expand values");
  // Writing through the expanded view writes the one shared element.
  Tensor w = e;
  w.set({1, 2, 3}, 30.0);
  EXPECT_EQ(c.at({2, 0}), 30.0);
  EXPECT_EQ(e.at({0, 2, 0}), 30.0);
}

TEST(tensor_test, expand_of_a_non_unit_dimension_names_both_shapes) {
  const Tensor c = zeros({3, 2});
  EXPECT_THROW_MSG((c.expand({3, 4})), ampscope::ShapeError, "expand", "[3, 2]", "[3, 4]", "dimension 1");
  EXPECT_THROW_MSG((c.expand({2})), ampscope::ShapeError, "expand", "[3, 2]", "[2]", "fewer dimensions");
}

// ---- contiguous, clone, to ----------------------------------------------------------------------

TEST(tensor_test, contiguous_returns_self_when_contiguous_and_a_copy_otherwise) {
  const Tensor a = arange(6).reshape({2, 3});
  EXPECT_TRUE(a.contiguous().shares_storage_with(a));
  const Tensor t = a.transpose(0, 1);
  const Tensor c = t.contiguous();
  EXPECT_FALSE(c.shares_storage_with(a));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{2, 1}));
  expect_values(c.values(), {0, 3, 1, 4, 2, 5}, "contiguous of transpose");
  // An expanded tensor (stride 0) is not contiguous either.
  const Tensor e = from_values({7}, {1}).expand({3});
  EXPECT_FALSE(e.is_contiguous());
  expect_values(e.contiguous().values(), {7, 7, 7}, "contiguous of expand");
}

TEST(tensor_test, clone_always_copies) {
  const Tensor a = arange(4);
  Tensor c = a.clone();
  EXPECT_FALSE(c.shares_storage_with(a));
  c.set({0}, 9.0);
  EXPECT_EQ(a.at({0}), 0.0);
  EXPECT_EQ(c.dtype(), a.dtype());
}

TEST(tensor_test, to_the_same_dtype_or_device_returns_a_tensor_sharing_storage) {
  const Tensor a = arange(4, {.dtype = DType::f16});
  EXPECT_TRUE(a.to(DType::f16).shares_storage_with(a));
  EXPECT_TRUE(a.to(Device::cpu()).shares_storage_with(a));
  const Tensor b = a.to(DType::f32);
  EXPECT_FALSE(b.shares_storage_with(a));
  EXPECT_EQ(b.dtype(), DType::f32);
}

TEST(tensor_test, to_f16_overflows_to_inf_and_underflows_to_zero_like_float16) {
  // 70000 >= 65520 (the tie between 65504 and 2^16) -> inf; 65519 < 65520 -> 65504, the f16 max;
  // 1e-8 < 2^-25 (half the smallest subnormal 2^-24 = 5.96e-8) -> 0; 3e-8 > 2^-25 -> 2^-24; NaN stays NaN.
  const std::vector<double> in = {70000, 65519, 65520, 1e-8, -1e-8, 3e-8, std::nan(""), -70000, 0.1, 6e-5, -kInf};
  const Tensor x = from_values(in, {static_cast<std::int64_t>(in.size())}, {.dtype = DType::f32});
  const Tensor h = x.to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  std::vector<double> ref;
  for (double v : in) ref.push_back(f16_ref(v));
  expect_values(h.values(), ref, "f32 -> f16");
  EXPECT_EQ(h.at({0}), kInf);
  EXPECT_EQ(h.at({1}), 65504.0);
  EXPECT_EQ(h.at({3}), 0.0);
  EXPECT_TRUE(std::signbit(h.at({4})));  // -1e-8 -> -0
  EXPECT_EQ(h.at({5}), std::ldexp(1.0, -24));
  EXPECT_TRUE(std::isnan(h.at({6})));
}

TEST(tensor_test, to_i64_and_bool_follow_the_conversion_rules) {
  // Truncation toward zero, NaN -> 0, saturation at the int64 range (2^63 itself is one past INT64_MAX;
  // 2^63 - 1024, the largest double below it, converts exactly); bool is x != 0 with NaN true.
  const Tensor x = from_values({-3.7, 3.7, std::nan(""), kInf, -kInf, 0.0, 9223372036854775808.0,
                                9223372036854774784.0, -9223372036854775808.0, 1e300},
                               {10}, {.dtype = DType::f64});
  const Tensor i = x.to(DType::i64);
  const std::int64_t* p = i.data_as<std::int64_t>();
  const std::int64_t expected[] = {-3, 3, 0, INT64_MAX, INT64_MIN, 0, INT64_MAX, 9223372036854774784LL, INT64_MIN,
                                   INT64_MAX};
  for (int k = 0; k < 10; ++k) EXPECT_EQ(p[k], expected[k]) << "element " << k;
  expect_values(x.to(DType::boolean).values(), {1, 1, 1, 1, 1, 0, 1, 1, 1, 1}, "f64 -> bool");
  // The same from f32 storage: the largest float below 2^63 is 2^63 - 2^39.
  const Tensor f = from_values({9223372036854775808.0, 9223371487098961920.0, -1e30}, {3}, {.dtype = DType::f32});
  const Tensor j = f.to(DType::i64);
  EXPECT_EQ(j.data_as<std::int64_t>()[0], INT64_MAX);
  EXPECT_EQ(j.data_as<std::int64_t>()[1], 9223371487098961920LL);
  EXPECT_EQ(j.data_as<std::int64_t>()[2], INT64_MIN);
}

TEST(tensor_test, to_f16_of_a_large_strided_tensor_matches_float16_element_by_element) {
  // 400 x 500 = 200,000 elements (above the 32,768-element grain, so the copy is split across threads),
  // read through a transposed view so the strided path runs. Values span the f16 range, including
  // overflow and subnormals: v(k) = (k mod 9973 - 4986) * 13.37 scaled by a power of two cycling over
  // 2^-30 .. 2^5.
  constexpr int R = 400, C = 500;
  std::vector<double> in(R * C);
  for (int k = 0; k < R * C; ++k) in[k] = ((k % 9973) - 4986) * 13.37 * std::ldexp(1.0, (k % 36) - 30);
  const Tensor x = from_values(in, {R, C}, {.dtype = DType::f32});
  const Tensor h = x.transpose(0, 1).to(DType::f16);  // [C, R]
  ASSERT_EQ(h.shape(), (Shape{C, R}));
  std::vector<double> ref(R * C);
  for (int j = 0; j < C; ++j)
    for (int i = 0; i < R; ++i) ref[j * R + i] = f16_ref(in[i * C + j]);
  expect_values(h.values(), ref, "large transposed f32 -> f16");
}

// ---- copy_ and fill_ ----------------------------------------------------------------------------

TEST(tensor_test, copy_into_a_transposed_view_casts_and_scatters) {
  // dst is a contiguous [3, 2] f16 tensor; its transpose is a [2, 3] view with strides [1, 2]. Copying a
  // [2, 3] f64 source into the view puts src[i][j] at dst[j][i], rounded f64 -> f32 -> f16.
  const std::vector<double> src_values = {0.1, 1.0 / 3.0, 65519.999999, -2.5e-8, 1e5, 2049.0};
  const Tensor src = from_values(src_values, {2, 3}, {.dtype = DType::f64});
  Tensor dst = zeros({3, 2}, {.dtype = DType::f16});
  Tensor view = dst.transpose(0, 1);
  view.copy_(src);
  std::vector<double> ref(6);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) ref[j * 2 + i] = f16_ref(src_values[i * 3 + j]);
  expect_values(dst.values(), ref, "dst after copy_ into its transpose");
  // 65519.999999 -> float 65520 -> f16 +inf (the tie rounds to the even 2^16, i.e. overflows).
  EXPECT_EQ(dst.at({2, 0}), kInf);
  EXPECT_EQ(view.dtype(), DType::f16);
}

TEST(tensor_test, copy_with_a_different_shape_names_both_shapes) {
  Tensor dst = zeros({3, 2});
  EXPECT_THROW_MSG((dst.copy_(zeros({2, 3}))), ampscope::ShapeError, "copy_", "[2, 3]", "[3, 2]");
}

TEST(tensor_test, fill_on_a_slice_changes_only_the_slice) {
  // Columns 1 and 2 of a [4, 5] tensor are set to 7; everything else stays 0.
  Tensor a = zeros({4, 5});
  a.slice(1, 1, 3).fill_(7.0);
  std::vector<double> ref(20, 0.0);
  for (int i = 0; i < 4; ++i) ref[i * 5 + 1] = ref[i * 5 + 2] = 7.0;
  expect_values(a.values(), ref, "after fill_ of a[:, 1:3]");
  // A stepped slice: every other element of a row.
  Tensor b = zeros({8}, {.dtype = DType::f16});
  b.slice(0, 1, 8, 3).fill_(0.1);  // elements 1, 4, 7
  const double h = f16_ref(0.1);
  expect_values(b.values(), {0, h, 0, 0, h, 0, 0, h}, "after fill_ of b[1::3] with 0.1 in f16");
}

TEST(tensor_test, fill_of_a_large_strided_view_reaches_every_element) {
  // A [600, 400] tensor; fill the transposed view of its column slice 100:300 (200 x 600 = 120,000
  // elements, strided, split across threads).
  Tensor a = zeros({600, 400});
  a.slice(1, 100, 300).transpose(0, 1).fill_(-1.5);
  std::vector<double> ref(600 * 400, 0.0);
  for (int i = 0; i < 600; ++i)
    for (int j = 100; j < 300; ++j) ref[i * 400 + j] = -1.5;
  expect_values(a.values(), ref, "after fill_ of a large strided view");
}

// ---- element access -----------------------------------------------------------------------------

TEST(tensor_test, at_and_set_accept_negative_indices) {
  Tensor a = arange(12).reshape({3, 4});
  EXPECT_EQ(a.at({-1, -1}), 11.0);  // [2][3]
  EXPECT_EQ(a.at({-3, 0}), 0.0);
  EXPECT_EQ(a.at({1, -4}), 4.0);  // [1][0]
  a.set({-1, 0}, 100.0);
  EXPECT_EQ(a.at({2, 0}), 100.0);
  // Through a view: the transpose's [-1][0] is a[0][3].
  EXPECT_EQ(a.transpose(0, 1).at({-1, 0}), 3.0);
}

TEST(tensor_test, set_rounds_to_the_dtype) {
  Tensor h = zeros({4}, {.dtype = DType::f16});
  h.set({0}, 0.1);
  h.set({1}, 65519.0);
  h.set({2}, 70000.0);
  h.set({3}, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40));  // through float: the tie, to 1.0
  expect_values(h.values(), {f16_ref(0.1), 65504.0, kInf, 1.0}, "set on f16");
  EXPECT_EQ(h.at({0}), 0.0999755859375);  // 1638 * 2^-14
  Tensor i = zeros({1}, {.dtype = DType::i64});
  i.set({0}, -3.7);
  EXPECT_EQ(i.item(), -3.0);
}

TEST(tensor_test, out_of_range_index_names_index_dimension_and_shape) {
  Tensor a = zeros({3, 4});
  EXPECT_THROW_MSG((a.at({3, 0})), ampscope::IndexError, "at", "index 3", "dimension 0", "size 3", "[3, 4]");
  EXPECT_THROW_MSG((a.at({0, -5})), ampscope::IndexError, "at", "index -5", "dimension 1", "size 4", "[3, 4]");
  EXPECT_THROW_MSG((a.set({1, 4}, 1.0)), ampscope::IndexError, "set", "index 4", "dimension 1", "[3, 4]");
}

TEST(tensor_test, index_of_the_wrong_rank_names_the_index_and_the_shape) {
  Tensor a = zeros({3, 4});
  EXPECT_THROW_MSG((a.at({1})), ampscope::IndexError, "at", "[1]", "1 components", "[3, 4]", "2 dimensions");
  EXPECT_THROW_MSG((a.set({1, 2, 3}, 0.0)), ampscope::IndexError, "set", "[1, 2, 3]", "3 components", "[3, 4]",
                   "2 dimensions");
}

TEST(tensor_test, item_needs_exactly_one_element) {
  EXPECT_EQ(full({1, 1}, 4.5).item(), 4.5);
  EXPECT_THROW_MSG((zeros({2, 3}).item()), ampscope::ShapeError, "item", "6 elements", "[2, 3]");
  EXPECT_THROW_MSG((zeros({0}).item()), ampscope::ShapeError, "item", "0 elements", "[0]");
}

// ---- devices ------------------------------------------------------------------------------------

TEST(tensor_test, to_cuda_without_a_gpu_says_the_device_is_not_available) {
  if (ampscope::cuda_status().device_count != 0) {
    GTEST_SKIP() << "a CUDA device is present; this test checks the message when there is none";
  }
  const Tensor a = arange(3);
  EXPECT_THROW_MSG(a.to(Device::cuda()), ampscope::DeviceError, "cuda:0", "not available", "'cpu'");
  EXPECT_THROW_MSG((zeros({2}, {.device = Device::cuda(1)})), ampscope::DeviceError, "cuda:1", "not available");
}

TEST(tensor_test, device_parse_accepts_cpu_and_cuda_forms) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(fmt::format("{}", Device::cuda(1)), "cuda:1");
}

TEST(tensor_test, device_parse_of_an_unknown_device_lists_the_valid_forms) {
  EXPECT_THROW_MSG(Device::parse("tpu"), ampscope::DeviceError, "'tpu'", "'cpu'", "'cuda'", "'cuda:N'");
  EXPECT_THROW_MSG(Device::parse("cuda:"), ampscope::DeviceError, "'cuda:'", "'cuda:N'");
  EXPECT_THROW_MSG(Device::parse("cuda:-1"), ampscope::DeviceError, "'cuda:-1'");
  EXPECT_THROW_MSG(Device::parse("cuda:1x"), ampscope::DeviceError, "'cuda:1x'");
}

// ---- printing -----------------------------------------------------------------------------------

TEST(tensor_test, prints_a_small_f16_tensor_with_shortest_round_trip_text) {
  // Cells: f16(0.1) -> "0.1"; 3 -> "3."; -1.5 -> "-1.5"; 65504 -> "65504."; f16(1/3) = 0.333251953125
  // -> "0.3333" (0.333 would read back as a different f16). Widest cell is 6, all right-aligned.
  const Tensor t = from_values({0.1, 3, -1.5, 65504, 1.0 / 3.0}, {5}, {.dtype = DType::f16});
  EXPECT_EQ(fmt::format("{}", t), "tensor([   0.1,     3.,   -1.5, 65504., 0.3333], dtype=f16, device=cpu)");
}

TEST(tensor_test, prints_rows_on_separate_lines_aligned_under_the_first) {
  const Tensor t = arange(6, {.dtype = DType::f16}).reshape({2, 3});
  EXPECT_EQ(fmt::format("{}", t), "tensor([[0., 1., 2.],\n        [3., 4., 5.]], dtype=f16, device=cpu)");
  // The transposed view prints its own row-major order.
  EXPECT_EQ(fmt::format("{}", t.transpose(0, 1)),
            "tensor([[0., 3.],\n        [1., 4.],\n        [2., 5.]], dtype=f16, device=cpu)");
}

TEST(tensor_test, prints_blocks_of_a_three_dimensional_tensor_separated_by_a_blank_line) {
  // As torch.arange(8.).reshape(2, 2, 2) prints: inner rows indented under the first, blocks apart.
  EXPECT_EQ(fmt::format("{}", arange(8).reshape({2, 2, 2})),
            "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]], dtype=f32, "
            "device=cpu)");
}

TEST(tensor_test, prints_special_values_scalars_integers_and_bools) {
  const Tensor s = from_values({kInf, -kInf, std::nan(""), -0.0}, {4}, {.dtype = DType::f16});
  EXPECT_EQ(fmt::format("{}", s), "tensor([ inf, -inf,  nan,  -0.], dtype=f16, device=cpu)");
  EXPECT_EQ(fmt::format("{}", from_values({2.5}, {}, {.dtype = DType::f16})), "tensor(2.5, dtype=f16, device=cpu)");
  EXPECT_EQ(fmt::format("{}", arange(3, {.dtype = DType::i64})), "tensor([0, 1, 2], dtype=i64, device=cpu)");
  EXPECT_EQ(fmt::format("{}", from_values({1, 0}, {2}, {.dtype = DType::boolean})),
            "tensor([ true, false], dtype=bool, device=cpu)");
  EXPECT_EQ(fmt::format("{}", zeros({0})), "tensor([], dtype=f32, device=cpu)");
}

TEST(tensor_test, prints_only_the_edges_of_a_tensor_above_a_thousand_elements) {
  // 1001 elements: the first three and last three, cells as wide as "1000." (5).
  EXPECT_EQ(fmt::format("{}", arange(1001)),
            "tensor([   0.,    1.,    2., ...,  998.,  999., 1000.], dtype=f32, device=cpu)");
}

TEST(tensor_test, prints_int64_values_exactly) {
  // torch.tensor([2**53 + 1, 2**63 - 1]) prints both exactly. A double cannot hold either, so the values
  // are written through the typed pointer.
  Tensor t = zeros({2}, {.dtype = DType::i64});
  t.data_as<std::int64_t>()[0] = 9007199254740993LL;  // 2^53 + 1
  t.data_as<std::int64_t>()[1] = INT64_MAX;
  EXPECT_EQ(fmt::format("{}", t),
            "tensor([   9007199254740993, 9223372036854775807], dtype=i64, device=cpu)");
}

}  // namespace

TEST(tensor_test, copy_into_an_expanded_view_is_refused_because_its_elements_overlap) {
  Tensor base = zeros({1, 3});
  Tensor expanded = base.expand({4, 3});
  EXPECT_THROW_MSG(expanded.copy_(ones({4, 3})), ampscope::ShapeError, "copy_:", "[4, 3]", "[0, 1]", "hint:");
}

TEST(tensor_test, slice_with_a_huge_step_takes_the_first_element_only) {
  const Tensor t = arange(10);
  const Tensor s = t.slice(0, 2, 10, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(s.shape(), (Shape{1}));
  EXPECT_EQ(s.item(), 2.0);
}

TEST(tensor_test, arange_in_f64_is_start_plus_index_times_step_rounded_twice_not_fused) {
  // start + i * step with a rounding after the multiply and after the add, on every backend; a fused
  // multiply-add would round once and differ (for example at i = 5: 0.6 vs 0.6000000000000001).
  const Tensor t = arange(0.1, 100.0, 0.1, {.dtype = DType::f64});
  const std::vector<double> v = t.values();
  int wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    volatile double product = static_cast<double>(i) * 0.1;  // volatile: no contraction in the reference either
    const double expected = 0.1 + product;
    if (v[i] != expected && wrong++ < 5) ADD_FAILURE() << "element " << i << ": " << v[i] << " != " << expected;
  }
  EXPECT_EQ(wrong, 0);
}

// ---- storage serial numbers and versions (the probe's statistics cache relies on them) ----------

TEST(tensor_test, a_storage_serial_is_never_reused_and_views_share_it) {
  std::uint64_t last = 0;
  for (int i = 0; i < 50; ++i) {
    // Each tensor is freed before the next is made, so the allocator may hand the same bytes back.
    const Tensor t = zeros({16});
    const Tensor view = t.reshape({4, 4}).transpose(0, 1);
    EXPECT_EQ(view.storage_serial(), t.storage_serial());
    EXPECT_GT(t.storage_serial(), last) << "tensor " << i;
    last = t.storage_serial();
  }
}

TEST(tensor_test, every_route_to_a_writable_pointer_changes_the_version_and_reading_does_not) {
  Tensor t = arange(12).reshape({3, 4});
  const Tensor view = t.transpose(0, 1);
  auto changes = [&](const char* what, const std::function<void()>& f) {
    const std::uint64_t v = view.storage_version();
    f();
    EXPECT_NE(view.storage_version(), v) << what << " (seen through another view of the storage)";
  };
  auto keeps = [&](const char* what, const std::function<void()>& f) {
    const std::uint64_t v = t.storage_version();
    f();
    EXPECT_EQ(t.storage_version(), v) << what;
  };
  changes("data()", [&] { (void)t.data(); });
  changes("data_as()", [&] { (void)t.data_as<float>(); });
  changes("kernel_view()", [&] { (void)t.kernel_view(); });
  changes("copy_", [&] { t.copy_(ones({3, 4})); });
  changes("fill_", [&] { t.fill_(2.0); });
  changes("set", [&] { t.set({1, 1}, 5.0); });
  changes("an in-place write through a slice", [&] { t.slice(0, 1, 2).fill_(0.0); });
  keeps("read_data()", [&] { (void)t.read_data(); });
  keeps("at()", [&] { (void)t.at({2, 3}); });
  keeps("item()", [&] { (void)t.slice(0, 0, 1).slice(1, 0, 1).item(); });
  keeps("storage_serial()", [&] { (void)t.storage_serial(); });
}

TEST(tensor_test, a_clone_knows_its_source_until_it_is_written) {
  const Tensor source = arange(24).reshape({2, 3, 4}).slice(0, 1, 2);  // contiguous, at offset 12
  ASSERT_TRUE(source.is_contiguous());
  const std::uint64_t version = source.storage_version();
  Tensor copy = source.clone();
  ampscope::StorageCopy from;
  ASSERT_TRUE(copy.copied_from(from));
  EXPECT_EQ(from.serial, source.storage_serial());
  EXPECT_EQ(from.version, version) << "the source as it was before the copy read it";
  EXPECT_EQ(from.offset, 12);
  EXPECT_EQ(from.numel, 12);
  EXPECT_EQ(from.dtype, DType::f32);
  EXPECT_FALSE(copy.reshape({12}).slice(0, 1, 12).copied_from(from)) << "part of the clone is not the source";
  copy.set({0, 0, 0}, -1.0);
  EXPECT_FALSE(copy.copied_from(from)) << "written since the copy";
  // A clone of a view that is not contiguous holds the values in another order: no source.
  EXPECT_FALSE(arange(6).reshape({2, 3}).transpose(0, 1).clone().copied_from(from));
  EXPECT_FALSE(zeros({3}).copied_from(from)) << "not a clone";
}

