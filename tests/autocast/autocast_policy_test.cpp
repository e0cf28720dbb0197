// tests/autocast/autocast_policy_test.cpp: the output dtype of every op of our policy table
// (reference/amp-semantics.md 2.9) inside f16 and bf16 autocast regions, after PyTorch's
// test_autocast_torch_fp16/_bf16, _fp32, _expect_builtin_promote, _banned and _ignored_types.
//
// The reference for an op run under autocast is the same op run with autocast off on inputs cast by hand
// to the dtype the policy names: autocast must insert exactly those casts and nothing else, so the two
// agree bit for bit. Where built-in type promotion decides, the expected elements are worked out here in
// float with the host's own _Float16 rounding (tests/test_support.h).
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using ::ampscope::testing::reference_f16;

// Same dtype, same shape, and every element with the same bits (values() widens exactly to double).
::testing::AssertionResult bit_equal(const Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << dtype_name(actual.dtype()) << ", expected "
                                         << dtype_name(expected.dtype());
  }
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << ", expected "
                                         << shape_str(expected.shape());
  }
  const std::vector<double> a = actual.values(), e = expected.values();
  std::size_t mismatches = 0;
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint64_t ab = 0, eb = 0;
    std::memcpy(&ab, &a[i], sizeof ab);
    std::memcpy(&eb, &e[i], sizeof eb);
    if (ab == eb) continue;
    if (++mismatches <= 5) failure << "\n  [" << i << "] actual " << a[i] << ", expected " << e[i];
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return failure << "\n  " << mismatches << " of " << a.size() << " elements differ";
}

Tensor param(Tensor t) {
  t.requires_grad_();
  return t;
}

// ---- lower_precision_fp: matmul, bmm, linear, conv2d, scaled_dot_product_attention ----

// f32 inputs and f32 parameters (leaves that require grad, as a model's) in a `lower` region.
void check_lower_precision_ops(DType lower) {
  Generator gen(11);
  const Tensor a = randn({3, 4}, gen), b = randn({4, 5}, gen);
  const Tensor a3 = randn({2, 3, 4}, gen), b3 = randn({2, 4, 5}, gen);
  const Tensor x = randn({3, 4}, gen), w = param(randn({5, 4}, gen)), bias = param(randn({5}, gen));
  const Tensor img = randn({1, 2, 5, 5}, gen), kw = param(randn({3, 2, 3, 3}, gen)), kb = param(randn({3}, gen));
  const Tensor q = randn({2, 3, 4}, gen), k = randn({2, 3, 4}, gen), v = randn({2, 3, 4}, gen);

  Tensor mm, bm, lin, conv, att;
  {
    AutocastGuard region(lower);
    mm = matmul(a, b);
    bm = bmm(a3, b3);
    lin = linear(x, w, bias);
    conv = conv2d(img, kw, kb, {.padding_h = 1, .padding_w = 1});
    att = scaled_dot_product_attention(q, k, v, /*causal=*/true);
  }
  EXPECT_TRUE(bit_equal(mm, matmul(a.to(lower), b.to(lower)))) << "matmul";
  EXPECT_TRUE(bit_equal(bm, bmm(a3.to(lower), b3.to(lower)))) << "bmm";
  EXPECT_TRUE(bit_equal(lin, linear(x.to(lower), w.to(lower), bias.to(lower)))) << "linear";
  EXPECT_TRUE(bit_equal(conv, conv2d(img.to(lower), kw.to(lower), kb.to(lower), {.padding_h = 1, .padding_w = 1})))
      << "conv2d";
  EXPECT_TRUE(bit_equal(att, scaled_dot_product_attention(q.to(lower), k.to(lower), v.to(lower), true)))
      << "scaled_dot_product_attention";
}

TEST(autocast_policy_test, lower_precision_fp_ops_give_f16_equal_to_manual_casts_in_an_f16_region) {
  check_lower_precision_ops(DType::f16);
}

TEST(autocast_policy_test, lower_precision_fp_ops_give_bf16_equal_to_manual_casts_in_a_bf16_region) {
  check_lower_precision_ops(DType::bf16);
}

TEST(autocast_policy_test, lower_precision_fp_ops_cast_f16_inputs_to_bf16_in_a_bf16_region) {
  // 2.8: the bf16 region casts to bf16 whatever the eligible input's dtype, f16 included.
  Generator gen(12);
  const Tensor a = randn({3, 4}, gen, {.dtype = DType::f16}), b = randn({4, 2}, gen);
  Tensor out;
  {
    AutocastGuard region(DType::bf16);
    out = matmul(a, b);
  }
  EXPECT_TRUE(bit_equal(out, matmul(a.to(DType::bf16), b.to(DType::bf16))));
}

// ---- fp32: exp, log, rsqrt, pow, layer_norm, nll_loss, mse_loss, binary_cross_entropy_with_logits ----

// Inputs in the region's own lower dtype, as the output of an earlier lower_precision_fp op would be.
void check_fp32_ops(DType lower) {
  Generator gen(21);
  const DType f32 = DType::f32;
  const Tensor x = randn({3, 4}, gen, {.dtype = lower});
  const Tensor pos = add(rand({3, 4}, gen, {.dtype = lower}), 0.5);  // log, rsqrt and pow(2.5) need > 0
  const Tensor y = randn({3, 4}, gen, {.dtype = lower});
  const Tensor probs = rand({3, 4}, gen, {.dtype = lower});
  const Tensor ln_w = randn({4}, gen, {.dtype = lower}), ln_b = randn({4}, gen, {.dtype = lower});
  const Tensor ln_w32 = param(randn({4}, gen)), ln_b32 = param(randn({4}, gen));
  const Tensor logp = log_softmax(randn({3, 4}, gen, {.dtype = lower}), 1, lower);
  const Tensor target = from_values({0, 3, 1}, {3}, {.dtype = DType::i64});

  Tensor e, l, r, p, ln, ln_mixed, nll, mse, bce;
  {
    AutocastGuard region(lower);
    e = exp(x);
    l = log(pos);
    r = rsqrt(pos);
    p = pow(pos, 2.5);
    ln = layer_norm(x, {4}, ln_w, ln_b);
    ln_mixed = layer_norm(x, {4}, ln_w32, ln_b32);  // f32 LayerNorm parameters after a lower-precision layer
    nll = nll_loss(logp, target);
    mse = mse_loss(x, y);
    bce = binary_cross_entropy_with_logits(x, probs);
  }
  EXPECT_TRUE(bit_equal(e, exp(x.to(f32)))) << "exp";
  EXPECT_TRUE(bit_equal(l, log(pos.to(f32)))) << "log";
  EXPECT_TRUE(bit_equal(r, rsqrt(pos.to(f32)))) << "rsqrt";
  EXPECT_TRUE(bit_equal(p, pow(pos.to(f32), 2.5))) << "pow";
  EXPECT_TRUE(bit_equal(ln, layer_norm(x.to(f32), {4}, ln_w.to(f32), ln_b.to(f32)))) << "layer_norm";
  EXPECT_TRUE(bit_equal(ln_mixed, layer_norm(x.to(f32), {4}, ln_w32, ln_b32))) << "layer_norm, f32 parameters";
  EXPECT_TRUE(bit_equal(nll, nll_loss(logp.to(f32), target))) << "nll_loss";
  EXPECT_TRUE(bit_equal(mse, mse_loss(x.to(f32), y.to(f32)))) << "mse_loss";
  EXPECT_TRUE(bit_equal(bce, binary_cross_entropy_with_logits(x.to(f32), probs.to(f32))))
      << "binary_cross_entropy_with_logits";
}

TEST(autocast_policy_test, fp32_ops_give_f32_equal_to_manual_casts_on_f16_inputs) { check_fp32_ops(DType::f16); }

TEST(autocast_policy_test, fp32_ops_give_f32_equal_to_manual_casts_on_bf16_inputs) { check_fp32_ops(DType::bf16); }

// ---- fp32_set_opt_dtype: softmax, log_softmax, sum ----

void check_set_opt_dtype_ops(DType lower) {
  Generator gen(31);
  const DType f32 = DType::f32;
  const Tensor x = randn({3, 5}, gen, {.dtype = lower});
  Tensor sm, lsm, s, s_dim, sm_given, lsm_given, s_given;
  {
    AutocastGuard region(lower);
    sm = softmax(x, 1);
    lsm = log_softmax(x, 1);
    s = sum(x);
    s_dim = sum(x, {0}, /*keepdim=*/true);
    sm_given = softmax(x, 1, lower);
    lsm_given = log_softmax(x, 1, lower);
    s_given = sum(x, lower);
  }
  // Without a dtype: computed on the f32 values of the input and returned in f32.
  EXPECT_TRUE(bit_equal(sm, softmax(x.to(f32), 1))) << "softmax";
  EXPECT_TRUE(bit_equal(lsm, log_softmax(x.to(f32), 1))) << "log_softmax";
  EXPECT_TRUE(bit_equal(s, sum(x.to(f32)))) << "sum";
  EXPECT_TRUE(bit_equal(s_dim, sum(x.to(f32), {0}, true))) << "sum over a dimension";
  // An explicit dtype is the caller's: respected, here the lower dtype itself.
  EXPECT_TRUE(bit_equal(sm_given, softmax(x, 1))) << "softmax with a dtype";
  EXPECT_TRUE(bit_equal(lsm_given, log_softmax(x, 1))) << "log_softmax with a dtype";
  EXPECT_TRUE(bit_equal(s_given, sum(x))) << "sum with a dtype";
}

TEST(autocast_policy_test, set_opt_dtype_ops_give_f32_without_a_dtype_and_respect_a_given_one_for_f16) {
  check_set_opt_dtype_ops(DType::f16);
}

TEST(autocast_policy_test, set_opt_dtype_ops_give_f32_without_a_dtype_and_respect_a_given_one_for_bf16) {
  check_set_opt_dtype_ops(DType::bf16);
}

// ---- unlisted ops: their inputs' dtype, built-in promotion ----

TEST(autocast_policy_test, unlisted_ops_keep_their_inputs_dtype) {
  for (DType lower : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(lower));
    Generator gen(41);
    const Tensor x = randn({3, 4}, gen, {.dtype = lower});
    const Tensor img = randn({1, 1, 4, 4}, gen, {.dtype = lower});
    const Tensor x32 = randn({3, 4}, gen);
    Generator drop_gen(5), drop_ref_gen(5);
    Tensor r, g, mp, dr, m, m_dim, ad, mu, ct, r32, mp32;
    {
      AutocastGuard region(lower);
      r = relu(x);
      g = gelu(x);
      mp = max_pool2d(img);
      dr = dropout(x, 0.5, /*training=*/true, drop_gen);
      m = mean(x);
      m_dim = mean(x, {1});
      ad = add(x, x);
      mu = mul(x, x);
      ct = cat({x, x}, 0);
      // f32 stays f32: unlisted ops never lower precision.
      r32 = relu(x32);
      mp32 = max_pool2d(x32.reshape({1, 1, 3, 4}));
    }
    EXPECT_TRUE(bit_equal(r, relu(x))) << "relu";
    EXPECT_TRUE(bit_equal(g, gelu(x))) << "gelu";
    EXPECT_TRUE(bit_equal(mp, max_pool2d(img))) << "max_pool2d";
    EXPECT_TRUE(bit_equal(dr, dropout(x, 0.5, true, drop_ref_gen))) << "dropout";
    EXPECT_TRUE(bit_equal(m, mean(x))) << "mean";
    EXPECT_TRUE(bit_equal(m_dim, mean(x, {1}))) << "mean over a dimension";
    EXPECT_TRUE(bit_equal(ad, add(x, x))) << "add";
    EXPECT_TRUE(bit_equal(mu, mul(x, x))) << "mul";
    EXPECT_TRUE(bit_equal(ct, cat({x, x}, 0))) << "cat";
    EXPECT_EQ(r32.dtype(), DType::f32);
    EXPECT_EQ(mp32.dtype(), DType::f32);
  }
}

TEST(autocast_policy_test, unlisted_ops_with_mixed_inputs_follow_builtin_promotion) {
  // f16 [n] + f32 [n] -> f32; f16 [n] * f32 0-dim -> f16 (a dimensioned tensor outranks a 0-dim one of
  // the same category); cat of f16 and f32 -> f32 (the widest). Expected elements from the definition:
  // the f16 values widened to float, one float operation, rounded to f16 where the result is f16.
  const Tensor h = from_values({1.5, -2.25, 1000.0, 0.1}, {4}, {.dtype = DType::f16});
  const Tensor f = from_values({0.1, 3.0, 1.0e-3, -7.5}, {4});
  const Tensor s = from_values({1.1}, {});
  Tensor sum_mixed, prod_scalar_tensor, joined;
  {
    AutocastGuard region;
    sum_mixed = add(h, f);
    prod_scalar_tensor = mul(h, s);
    joined = cat({h, f}, 0);
  }
  const std::vector<double> hv = h.values(), fv = f.values();
  const float sv = static_cast<float>(s.item());
  ASSERT_EQ(sum_mixed.dtype(), DType::f32);
  ASSERT_EQ(prod_scalar_tensor.dtype(), DType::f16);
  ASSERT_EQ(joined.dtype(), DType::f32);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(sum_mixed.values()[i], static_cast<double>(static_cast<float>(hv[i]) + static_cast<float>(fv[i])))
        << "element " << i;
    EXPECT_EQ(prod_scalar_tensor.values()[i], reference_f16(static_cast<float>(hv[i]) * sv)) << "element " << i;
    EXPECT_EQ(joined.values()[i], hv[i]) << "element " << i;
    EXPECT_EQ(joined.values()[4 + i], fv[i]) << "element " << i;
  }
}

TEST(autocast_policy_test, embedding_keeps_the_dtype_of_its_f32_weight) {
  Generator gen(51);
  const Tensor table = param(randn({6, 3}, gen));
  const Tensor indices = from_values({4, 0, 4}, {3}, {.dtype = DType::i64});
  Tensor rows;
  {
    AutocastGuard region;
    rows = embedding(indices, table);
  }
  ASSERT_EQ(rows.dtype(), DType::f32);
  const std::vector<double> t = table.values(), got = rows.values();
  for (int r = 0; r < 3; ++r) {
    const int row = r == 1 ? 0 : 4;
    for (int c = 0; c < 3; ++c) EXPECT_EQ(got[r * 3 + c], t[row * 3 + c]) << "row " << r << ", column " << c;
  }
}

TEST(autocast_policy_test, cross_entropy_of_f16_logits_is_f32_through_its_log_softmax_and_nll_loss) {
  Generator gen(52);
  const Tensor logits = randn({4, 5}, gen, {.dtype = DType::f16});
  const Tensor target = from_values({1, 4, 0, 2}, {4}, {.dtype = DType::i64});
  Tensor loss;
  {
    AutocastGuard region;
    loss = cross_entropy(logits, target);
  }
  EXPECT_TRUE(bit_equal(loss, cross_entropy(logits.to(DType::f32), target)));
}

// ---- banned ----

TEST(autocast_policy_test, binary_cross_entropy_is_banned_with_a_message_naming_the_logits_version) {
  Generator gen(61);
  const Tensor probs = sigmoid(randn({4}, gen));
  const Tensor target = rand({4}, gen);
  for (DType lower : {DType::f16, DType::bf16}) {
    AutocastGuard region(lower);
    EXPECT_THROW_MSG(binary_cross_entropy(probs, target), Error, "binary_cross_entropy",
                     "binary_cross_entropy_with_logits", "hint:");
  }
  // Outside autocast, and in a disabled region, it is an ordinary op.
  EXPECT_EQ(binary_cross_entropy(probs, target).dtype(), DType::f32);
  AutocastGuard outer;
  AutocastGuard disabled(std::nullopt, /*enabled=*/false);
  EXPECT_EQ(binary_cross_entropy(probs, target).dtype(), DType::f32);
}

// ---- the ops for hand-written losses (core/ops.h) ----

// fp32 list: log1p, expm1, softplus and reciprocal (PyTorch's AT_FORALL_FP32 holds log1p, expm1,
// softplus, reciprocal). Lower-precision inputs compute and return f32, equal to a manual cast.
void check_fp32_loss_ops(DType lower) {
  Generator gen(81);
  const DType f32 = DType::f32;
  const Tensor x = randn({3, 4}, gen, {.dtype = lower});
  const Tensor pos = add(rand({3, 4}, gen, {.dtype = lower}), 0.5);
  Tensor l1p, em1, sp, sp_beta, rec, scalar_over;
  {
    AutocastGuard region(lower);
    l1p = log1p(pos);
    em1 = expm1(x);
    sp = softplus(x);
    sp_beta = softplus(x, 2.0, 3.0);
    rec = reciprocal(pos);
    scalar_over = 2.0 / pos;  // PyTorch's reciprocal(t) * 2: reciprocal runs in f32, so the product is f32
  }
  EXPECT_TRUE(bit_equal(l1p, log1p(pos.to(f32)))) << "log1p";
  EXPECT_TRUE(bit_equal(em1, expm1(x.to(f32)))) << "expm1";
  EXPECT_TRUE(bit_equal(sp, softplus(x.to(f32)))) << "softplus";
  EXPECT_TRUE(bit_equal(sp_beta, softplus(x.to(f32), 2.0, 3.0))) << "softplus with beta and threshold";
  EXPECT_TRUE(bit_equal(rec, reciprocal(pos.to(f32)))) << "reciprocal";
  EXPECT_TRUE(bit_equal(scalar_over, mul(reciprocal(pos.to(f32)), 2.0))) << "2 / t";
}

TEST(autocast_policy_test, fp32_loss_ops_give_f32_equal_to_manual_casts_on_f16_inputs) { check_fp32_loss_ops(DType::f16); }

TEST(autocast_policy_test, fp32_loss_ops_give_f32_equal_to_manual_casts_on_bf16_inputs) { check_fp32_loss_ops(DType::bf16); }

// On no list: rsub, abs, logsigmoid, clamp_min, clamp_max, maximum, minimum, max, min, amax, amin, var,
// std and silu (on no list of PyTorch's CUDA autocast either) run in their inputs' dtype (f16 stays f16, f32 stays f32), exactly as with autocast off; the
// policy each reports is "none". Mixed maximum inputs follow built-in promotion (f16 and f32 -> f32).
TEST(autocast_policy_test, unlisted_loss_ops_keep_their_inputs_dtype) {
  const std::vector<std::string_view> unlisted = {"rsub", "abs", "logsigmoid", "clamp_min", "clamp_max",
                                                  "maximum", "minimum", "max", "min", "amax", "amin", "var", "std",
                                                  "silu"};
  for (std::string_view op : unlisted) EXPECT_EQ(autocast_policy(op), probe::AutocastPolicy::none) << op;
  for (std::string_view op : {"log1p", "expm1", "softplus", "reciprocal"}) {
    EXPECT_EQ(autocast_policy(op), probe::AutocastPolicy::fp32) << op;
  }
  for (DType lower : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(lower));
    Generator gen(82);
    const Tensor x = randn({3, 4}, gen, {.dtype = lower}), y = randn({3, 4}, gen, {.dtype = lower});
    const Tensor x32 = randn({3, 4}, gen);
    std::vector<Tensor> in_region, reference;
    Tensor mixed, max_dim_values, max_dim_indices, x32_var;
    {
      AutocastGuard region(lower);
      in_region = {1.0 - x,        abs(x),          logsigmoid(x),    clamp_min(x, -0.5), clamp_max(x, 0.5),
                   maximum(x, y),  minimum(x, y),   max(x),           min(x),             amax(x, {1}),
                   amin(x, {0}),   var(x, {1}),     std(x),           -x,                 x * y,
                   silu(x)};
      const ValuesAndIndices m = max(x, 1);
      max_dim_values = m.values;
      max_dim_indices = m.indices;
      mixed = maximum(x, x32);
      x32_var = var(x32);
    }
    reference = {1.0 - x,       abs(x),        logsigmoid(x), clamp_min(x, -0.5), clamp_max(x, 0.5),
                 maximum(x, y), minimum(x, y), max(x),        min(x),             amax(x, {1}),
                 amin(x, {0}),  var(x, {1}),   std(x),        -x,                 x * y,
                 silu(x)};
    for (std::size_t i = 0; i < in_region.size(); ++i) {
      EXPECT_EQ(in_region[i].dtype(), lower) << "op " << i;
      EXPECT_TRUE(bit_equal(in_region[i], reference[i])) << "op " << i;
    }
    EXPECT_TRUE(bit_equal(max_dim_values, max(x, 1).values)) << "max over a dim";
    EXPECT_EQ(max_dim_indices.dtype(), DType::i64);
    EXPECT_TRUE(bit_equal(mixed, maximum(x.to(DType::f32), x32))) << "maximum of f16/bf16 and f32";
    EXPECT_EQ(x32_var.dtype(), DType::f32);
  }
}

// ---- ignored types: f64 and integers are never cast ----

TEST(autocast_policy_test, f64_and_integer_inputs_are_never_cast) {
  Generator gen(71);
  const Tensor a64 = randn({3, 4}, gen, {.dtype = DType::f64}), b64 = randn({4, 2}, gen, {.dtype = DType::f64});
  const Tensor b16 = randn({4, 2}, gen, {.dtype = DType::f16});
  const Tensor pos64 = add(rand({5}, gen, {.dtype = DType::f64}), 0.5);
  const Tensor ints = from_values({3, -1, 7}, {3}, {.dtype = DType::i64});
  Tensor mm64, p64, s64, sm64, joined_int, exp_int;
  {
    AutocastGuard region;
    // mm(double, half): the f64 stays f64, so the dtypes still differ.
    EXPECT_THROW_MSG(matmul(a64, b16), DTypeError, "matmul", "f64", "f16");
    mm64 = matmul(a64, b64);
    p64 = pow(pos64, 2.5);
    s64 = sum(pos64);
    sm64 = softmax(a64, 1);
    joined_int = cat({ints, ints}, 0);
    exp_int = exp(ints);  // not cast to f32 by autocast: exp's own rule makes integers floating
  }
  EXPECT_TRUE(bit_equal(mm64, matmul(a64, b64))) << "matmul";
  EXPECT_TRUE(bit_equal(p64, pow(pos64, 2.5))) << "pow";
  EXPECT_TRUE(bit_equal(s64, sum(pos64))) << "sum";
  EXPECT_TRUE(bit_equal(sm64, softmax(a64, 1))) << "softmax";
  ASSERT_EQ(joined_int.dtype(), DType::i64);
  EXPECT_EQ(joined_int.values(), (std::vector<double>{3, -1, 7, 3, -1, 7}));
  EXPECT_TRUE(bit_equal(exp_int, exp(ints))) << "exp of integers";
}

}  // namespace
}  // namespace ampscope
