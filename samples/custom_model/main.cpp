// How to watch your own model with ampscope: autocast, GradScaler, the probe and a trace file.
// Build: part of the project (target custom_model_example). Run: build/bin/custom_model_example out.h5
#include <fmt/format.h>

#include <ampscope/core/autocast.h>
#include <ampscope/core/grad_scaler.h>
#include <ampscope/core/nn.h>
#include <ampscope/core/optim.h>
#include <ampscope/probes/probe.h>
#include <ampscope/probes/trace/writer.h>

using namespace ampscope;

// Your model: any nn::Module. Its registered names ("encoder", "head") are what the trace shows.
struct MyModel : nn::Module {
  std::shared_ptr<nn::Linear> encoder, head;
  explicit MyModel(Generator& gen) : Module("MyModel") {
    encoder = register_module("encoder", std::make_shared<nn::Linear>(16, 32, gen));
    head = register_module("head", std::make_shared<nn::Linear>(32, 4, gen));
  }
  Tensor forward(const Tensor& x) override { return (*head)(gelu((*encoder)(x))); }
};

int main(int argc, char** argv) {
  Generator gen(0);
  MyModel model(gen);
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  GradScaler scaler({.device = "cpu"});
  const std::string path = argc > 1 ? argv[1] : "custom.h5";
  const trace::RunInfo run{.precision = "fp16", .device = "cpu", .model = "MyModel", .seed = 0, .config = "{}"};
  auto writer = std::make_shared<trace::TraceWriter>(path, run);
  auto probe = std::make_shared<probe::Probe>(writer, probe::ProbeOptions{.level = probe::Level::health});
  probe::HookGuard watching(probe);
  const Tensor x = randn({8, 16}, gen), y = from_values({0, 1, 2, 3, 0, 1, 2, 3}, {8}, {DType::i64});
  for (std::int64_t n = 0; n < 20; ++n) {
    probe::Step step(n);  // opens step n: the probe groups its ops, gradients and scaler events
    opt.zero_grad();
    Tensor loss;
    { AutocastGuard autocast; ScopeGuard in_loss("loss"); loss = cross_entropy(model(x), y); }  // f16, loss ops f32
    scaler.scale(loss).backward();
    if (n % 10 == 0) {  // a look at the model that the trace should not hold: the probe hears nothing
      probe::Paused paused;
      fmt::print("step {}: loss {:.4f}, mean logit {:.4f}\n", n, loss.item(), mean(model(x)).item());
    }
    step.finish(loss, opt, scaler);  // scaler.step(opt), scaler.update(), and the step's /steps row
  }
  writer->close();  // marks the trace complete
  fmt::print("wrote {}: {} NaN/inf origins\n", path, probe->counters().origins);
}
