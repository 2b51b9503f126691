// The main job: train a classifier on Fashion-MNIST with deft, Gluon style.
//
//   train_fashion_mnist [--model mlp|lenet|resnet18] [--width N] [--epochs N]
//                       [--batch-size N] [--lr X] [--optimizer sgd|adam] [--device LIST]
//                       (defaults: SGD lr 0.1 momentum 0.9 for the MLP and
//                        ResNet-18, Adam lr 0.001 for LeNet)
//                       [--shares LIST] [--data DIR] [--csv FILE] [--seed N]
//                       [--dropout P] [--clip-norm X] [--hybridize]
//                       [--checkpoint FILE] [--resume FILE]
//                       [--schedule constant|cosine] [--warmup N] [--dist]
//                       [--sync-bn]
//
// --device takes one device or a comma-separated list (cpu, cpu1, gpu0,
// cpu,gpu0). With several, training is data-parallel as in Gluon: each
// batch is split over the devices, each runs the network on its part with
// its own copy of the parameters, and the trainer sums the gradients.
// --shares gives each device's share of a batch (cpu,gpu0 --shares 1,8: the
// GPU takes 8 rows for each of the CPU's), for devices of different speeds;
// --shares auto times a forward and backward of one batch on each device
// alone first (measure_shares) and splits by those speeds. By default the
// rows are split evenly.
// --model resnet18 is the D2L chapter's ResNet-18 (nn::resnet18: BatchNorm,
// residual blocks, global average pooling), Kaiming-initialized; --width
// scales its channels: 64 is the full network, the default on GPUs, and
// 8 the default where a CPU takes part (about 1/64 of the work).
// --dropout P puts an nn::Dropout(P) after each hidden dense layer (active
// in training only; the evaluation sees the whole network).
// --clip-norm X clips the gradients to the global norm X before each update
// (nn::clip_global_norm between trainer.allreduce_grads() and
// trainer.update(); with --hybridize inside the traced step). They are sums
// over the batch, as in Gluon: at batch 256 their norm is about 250 in the
// first epoch and 160 in the third, so 20 clips every step. Each epoch
// then also prints the mean norm before clipping and how often it exceeded
// X (clip_global_norm's result, or TrainStep::grad_norm(), summed deferred).
// --hybridize runs each step as an nn::TrainStep: the whole step (forward,
// loss, backward, update) is traced at the second batch and replayed after
// that, as a few tasks instead of one per operation; with several devices
// the traced step holds every device's part and the gradients' allreduce.
// cpuN are logical devices sharing the CPU's workers: they run the
// data-parallel path without a GPU, at the speed of one device. gpuN needs
// this file compiled by nvcc against deft::cuda (train_fashion_mnist_gpu,
// built with DEFT_CUDA); every model.
//
// --schedule cosine lowers the learning rate along half a cosine to 0 over
// all the run's updates (nn::schedule::cosine); --warmup N first raises it
// linearly over N updates (nn::schedule::warmup). The trainer computes the
// rate inside each step, so a --hybridize step replays it as it is.
// --checkpoint FILE saves a checkpoint (nn::save_checkpoint: parameters,
// BatchNorm's statistics, the optimizer's state, the step count, the random
// state) after each epoch, atomically; --resume FILE loads one and goes on
// from the epoch after it up to --epochs, computing what the run that
// wrote it would have computed (the data order is the loader's seeded
// order of that epoch).
// --dist trains across the processes mpirun started (deft/dist.hpp; built
// when CMake finds MPI): `mpirun -np 2 train_fashion_mnist --dist`. Each
// rank loads its shard of every batch (the batch is the global one, split
// over the ranks), the Trainer broadcasts rank 0's initial parameters and
// sums the gradients across the ranks, the metrics are summed across them,
// and rank 0 alone prints and writes the CSV and checkpoints (--resume:
// every rank loads). BatchNorm's statistics follow each rank's rows, or
// with --sync-bn the whole batch's, combined across the ranks
// (nn::synchronize_batch_norm; one device per rank).
// Each epoch prints a progress bar, then the mean loss, train and test
// accuracy and samples per second; --csv writes those rows (plot them with
// scripts/plot_training.py). The last line is `test accuracy: 0.xxxx`.
// Nothing inside a batch synchronises: the loss and the number of correct
// predictions are summed as deferred tensors and read every few batches.
#include <deft/data.hpp>
#include <deft/nn.hpp>
#if DEFT_EXAMPLE_DIST
#include <deft/dist.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

using namespace deft;

namespace {

struct Options {
  std::string model = "mlp";
  std::int64_t width = 0;  // resnet18's channels; 0: by the devices
  int epochs = 10;
  std::int64_t batch_size = 256;
  std::optional<float> lr;
  std::string optimizer;  // default: sgd for the MLP, adam for LeNet
  std::string device = "cpu";
  std::vector<double> shares;  // empty: an even split
  bool measure_shares = false;  // --shares auto
  std::optional<std::filesystem::path> data;
  std::string csv;
  std::uint64_t seed = 42;
  float dropout = 0.0f;
  float clip_norm = 0.0f;  // 0: no clipping
  bool hybridize = false;
  std::string checkpoint, resume;
  std::string schedule = "constant";
  std::int64_t warmup = 0;  // updates
  bool dist = false;  // across mpirun's processes
  bool sync_bn = false;  // BatchNorm's statistics over the global batch
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "train_fashion_mnist: %s\n"
               "usage: train_fashion_mnist [--model mlp|lenet|resnet18] [--width N] [--epochs N] [--batch-size N]\n"
               "                           [--lr X]\n"
               "                           [--optimizer sgd|adam] [--device cpu|cpu1|gpu0|cpu,gpu0|...]\n"
               "                           [--shares X,Y,...|auto] [--data DIR] [--csv FILE] [--seed N]\n"
               "                           [--dropout P] [--clip-norm X] [--hybridize]\n"
               "                           [--checkpoint FILE] [--resume FILE]\n"
               "                           [--schedule constant|cosine] [--warmup N] [--dist] [--sync-bn]\n",
               problem.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    auto number = [&](const std::string& v) {
      try {
        std::size_t used = 0;
        const double d = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        return d;
      } catch (const std::exception&) {
        usage(a + " needs a number, got '" + v + "'");
      }
    };
    if (a == "--model") o.model = value();
    else if (a == "--width") {
      o.width = std::int64_t(number(value()));
      if (o.width < 1) usage("--width must be at least 1");
    }
    else if (a == "--epochs") o.epochs = int(number(value()));
    else if (a == "--batch-size") o.batch_size = std::int64_t(number(value()));
    else if (a == "--lr") o.lr = float(number(value()));
    else if (a == "--optimizer") o.optimizer = value();
    else if (a == "--schedule") o.schedule = value();
    else if (a == "--warmup") {
      o.warmup = std::int64_t(number(value()));
      if (o.warmup < 0) usage("--warmup must not be negative");
    }
    else if (a == "--device") o.device = value();
    else if (a == "--shares") {
      const std::string list = value();
      o.measure_shares = list == "auto";
      for (std::size_t at = 0; !o.measure_shares && at <= list.size();) {
        const std::size_t end = std::min(list.find(',', at), list.size());
        o.shares.push_back(number(list.substr(at, end - at)));
        if (!(o.shares.back() > 0) || !std::isfinite(o.shares.back()))
          usage("--shares: each share must be a positive number, got '" + list.substr(at, end - at) + "'");
        at = end + 1;
      }
    }
    else if (a == "--data") o.data = value();
    else if (a == "--csv") o.csv = value();
    else if (a == "--seed") o.seed = std::uint64_t(number(value()));
    else if (a == "--hybridize") o.hybridize = true;
    else if (a == "--dist") {
#if DEFT_EXAMPLE_DIST
      o.dist = true;
#else
      usage("--dist needs MPI: this build has no deft::dist (install libopenmpi-dev and configure again)");
#endif
    }
    else if (a == "--sync-bn") o.sync_bn = true;
    else if (a == "--checkpoint") o.checkpoint = value();
    else if (a == "--resume") o.resume = value();
    else if (a == "--dropout") o.dropout = float(number(value()));
    else if (a == "--clip-norm") {
      o.clip_norm = float(number(value()));
      if (!(o.clip_norm > 0) || !std::isfinite(o.clip_norm)) usage("--clip-norm must be a positive number");
    }
    else if (a == "--help" || a == "-h") usage("train a Fashion-MNIST classifier");
    else usage("unknown option '" + a + "'");
  }
  if (o.model != "mlp" && o.model != "lenet" && o.model != "resnet18")
    usage("--model must be mlp, lenet or resnet18, got '" + o.model + "'");
  if (o.width != 0 && o.model != "resnet18") usage("--width is for --model resnet18");
  if (o.optimizer.empty()) o.optimizer = o.model == "lenet" ? "adam" : "sgd";
  if (o.optimizer != "sgd" && o.optimizer != "adam") usage("--optimizer must be sgd or adam, got '" + o.optimizer + "'");
  if (o.epochs < 1) usage("--epochs must be at least 1");
  if (o.schedule != "constant" && o.schedule != "cosine")
    usage("--schedule must be constant or cosine, got '" + o.schedule + "'");
  if (o.batch_size < 1) usage("--batch-size must be at least 1");
  if (!(o.dropout >= 0.0f && o.dropout < 1.0f)) usage("--dropout must be in [0, 1)");
  if (o.sync_bn && !o.dist) usage("--sync-bn synchronizes BatchNorm across the processes of --dist; add --dist");
  if (o.sync_bn && o.model != "resnet18") usage("--sync-bn is for --model resnet18 (the others have no BatchNorm)");
  if (o.sync_bn && o.device.find(',') != std::string::npos) usage("--sync-bn needs one device per process");
  return o;
}

/// "cpu,gpu0" -> {cpu(0), gpu(0)}; "cpu" and "gpu" mean index 0.
std::vector<Device> parse_devices(const std::string& list) {
  std::vector<Device> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    const bool is_cpu = item.starts_with("cpu"), is_gpu = item.starts_with("gpu");
    const std::string index = item.substr(3);
    if ((!is_cpu && !is_gpu) || index.find_first_not_of("0123456789") != std::string::npos || index.size() > 3)
      usage("--device: '" + item + "' is not a device (cpu, cpuN, gpu or gpuN)");
    out.push_back(is_cpu ? cpu(index.empty() ? 0 : std::stoi(index)) : gpu(index.empty() ? 0 : std::stoi(index)));
    at = end + 1;
  }
  return out;
}

/// A comma-separated list of the devices, as printed.
std::string names(const std::vector<Device>& devices) {
  std::string s;
  for (const Device& d : devices) s += (s.empty() ? "" : ",") + d.to_string();
  return s;
}

std::shared_ptr<nn::Sequential> build(const std::string& model, float dropout, std::int64_t width) {
  if (model == "resnet18") return nn::resnet18(10, width);
  auto net = std::make_shared<nn::Sequential>();
  auto hidden = [&](std::int64_t units) {
    net->add(std::make_shared<nn::Dense>(units, nn::Act::relu));
    if (dropout > 0.0f) net->add(std::make_shared<nn::Dropout>(dropout));
  };
  if (model == "mlp") {
    hidden(256);
  } else {  // LeNet-5 with ReLU and max pooling (D2L's LeNet, modernised)
    net->add(std::make_shared<nn::Conv2D>(6, 5, 1, 2, nn::Act::relu), std::make_shared<nn::MaxPool2D>(2),
             std::make_shared<nn::Conv2D>(16, 5, 1, 0, nn::Act::relu), std::make_shared<nn::MaxPool2D>(2));
    hidden(120);
    hidden(84);
  }
  net->add(std::make_shared<nn::Dense>(10));
  return net;
}

/// A one-line progress bar redrawn in place (on a terminal only).
void progress(int epoch, std::int64_t done, std::int64_t total, double loss) {
  static const bool terminal = isatty(fileno(stderr));
  if (!terminal) return;
  constexpr int width = 30;
  const int filled = int(width * done / total);
  std::fprintf(stderr, "\repoch %2d [%.*s%*s] %5lld/%lld  loss %.4f", epoch, filled, "==============================",
               width - filled, "", static_cast<long long>(done), static_cast<long long>(total), loss);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  int rank = 0, ranks = 1;
#if DEFT_EXAMPLE_DIST
  if (opt.dist) {
    dist::init(&argc, &argv);
    rank = dist::rank();
    ranks = dist::size();
    if (rank != 0 && !std::freopen("/dev/null", "w", stdout)) throw std::runtime_error("cannot silence rank " + std::to_string(rank));
  }
#endif
  // Sums a metric over the ranks (each holds its own rows' share).
  auto over_ranks = [&opt](Tensor<float>& t) {
#if DEFT_EXAMPLE_DIST
    if (opt.dist) dist::allreduce(t);
#endif
    (void)opt;
    (void)t;
  };
  const std::vector<Device> devices = parse_devices(opt.device);
  if (!opt.shares.empty() && opt.shares.size() != devices.size())
    usage("--shares needs one share per device (" + std::to_string(devices.size()) + "), got " +
          std::to_string(opt.shares.size()));
  const bool on_cpu = std::ranges::any_of(devices, [](const Device& d) { return d.type == DeviceType::cpu; });
  const std::int64_t width = opt.width ? opt.width : on_cpu ? 8 : 64;
  const auto dir = data::find_fashion_mnist_dir(opt.data);
  const auto layout = opt.model == "mlp" ? data::Layout::flat : data::Layout::grid;
  const auto train = data::load_fashion_mnist(dir, data::Split::train, layout);
  const auto test = data::load_fashion_mnist(dir, data::Split::test, layout);
  char dropout[32] = "";
  if (opt.dropout > 0.0f) std::snprintf(dropout, sizeof dropout, " with dropout %g", double(opt.dropout));
  char clip[64] = "";
  if (opt.clip_norm > 0.0f) std::snprintf(clip, sizeof clip, ", gradients clipped to norm %g", double(opt.clip_norm));
  const std::string schedule = (opt.schedule == "cosine" ? ", cosine schedule" : "") +
                               (opt.warmup ? ", " + std::to_string(opt.warmup) + " warm-up updates" : std::string());
  const std::string model = opt.model + (opt.model == "resnet18" ? " width " + std::to_string(width) : "") + dropout +
                            clip + schedule + (opt.hybridize ? ", hybridized" : "");
  const std::string processes = ranks > 1 ? " in each of " + std::to_string(ranks) + " processes" : "";
  std::printf("Fashion-MNIST from %s: %lld train, %lld test images; model %s, %d epochs, batch %lld, %s, %s, %d workers%s\n",
              dir.string().c_str(), static_cast<long long>(train.size()), static_cast<long long>(test.size()),
              model.c_str(), opt.epochs, static_cast<long long>(opt.batch_size), opt.optimizer.c_str(),
              names(devices).c_str(), engine::num_workers(), processes.c_str());

  random::seed(opt.seed);
  auto net = build(opt.model, opt.dropout, width);
  // Refuses a device this build cannot run.
  net->initialize(opt.model == "resnet18" ? nn::init::kaiming() : nn::init::xavier(), devices);
  const float lr = opt.lr.value_or(opt.optimizer == "sgd" ? 0.1f : 0.001f);
  nn::Trainer trainer(net->collect_params(),
                      opt.optimizer == "sgd" ? std::variant<nn::SGD, nn::Adam>(nn::SGD{.learning_rate = lr, .momentum = 0.9f})
                                             : std::variant<nn::SGD, nn::Adam>(nn::Adam{.learning_rate = lr}));
  const std::int64_t updates = opt.epochs * ((train.size() + opt.batch_size - 1) / opt.batch_size);
  const nn::LRSchedule after = opt.schedule == "cosine" ? nn::schedule::cosine(std::max<std::int64_t>(updates - opt.warmup, 1))
                                                       : nn::schedule::constant();
  trainer.set_schedule(nn::schedule::warmup(opt.warmup, after));
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  std::optional<nn::TrainStep<nn::SoftmaxCrossEntropyLoss>> hybrid_step;
  if (opt.hybridize) {
    hybrid_step.emplace(*net, loss_fn, trainer);
    hybrid_step->set_max_grad_norm(opt.clip_norm);
  }
  // LeNet and ResNet read (batch, 1, 28, 28); the MLP reads the flat (batch, 784) rows.
  const bool images = opt.model != "mlp";
  auto as_input = [images](const Tensor<float>& x) {
    return images ? x.reshape({x.shape()[0], 1, x.shape()[1], x.shape()[2]}) : x;
  };

  // --shares auto: each device's speed on a whole batch, alone. The first
  // call draws the weights, as the first training step would.
  std::vector<double> shares = opt.shares;
  if (opt.measure_shares && devices.size() > 1) {
    const std::int64_t rows = std::min(opt.batch_size, train.size());
    const Tensor<float> x = as_input(train.images.rows(0, rows));
    const Tensor<std::int64_t> y = train.labels.rows(0, rows);
    // Timed in training mode, as the steps run; BatchNorm's running
    // statistics take this batch in as well.
    shares = measure_shares(devices, [&](Device d) {
      autograd::record rec;
      loss_fn((*net)(x.to(d)), y.to(d)).backward();
    });
  }
  if (!shares.empty()) {
    std::printf("shares of a batch%s:", opt.measure_shares ? " (batches per second, measured)" : "");
    for (std::size_t d = 0; d < devices.size(); ++d) std::printf(" %s %.4g", devices[d].to_string().c_str(), shares[d]);
    std::printf("\n");
  }

  // A part of the batch per device (the batch itself for one device), in
  // proportion to the shares when there are some; a last batch with fewer
  // rows than devices goes to fewer devices.
  auto split = [&devices, &shares](const Tensor<float>& x, const Tensor<std::int64_t>& y) {
    const auto n = std::min(devices.size(), std::size_t(x.shape()[0]));
    const std::vector<Device> use(devices.begin(), devices.begin() + std::ptrdiff_t(n));
    if (shares.empty()) return std::pair{split_and_load(x, use), split_and_load(y, use)};
    const std::vector<double> part(shares.begin(), shares.begin() + std::ptrdiff_t(n));
    return std::pair{split_and_load(x, use, part), split_and_load(y, use, part)};
  };

  data::DataLoader train_loader(train.images, train.labels, opt.batch_size,
                                {.shuffle = true, .seed = opt.seed, .num_shards = ranks, .shard = rank});
  data::DataLoader test_loader(test.images, test.labels, 1000, {.shuffle = false, .num_shards = ranks, .shard = rank});
#if DEFT_EXAMPLE_DIST
  if (opt.dist) {
    // The parameters get their shapes from a first input; then rank 0's
    // values go to every rank, and each step sums the gradients across ranks.
    (void)(*net)(as_input(train.images.rows(0, 1)).to(devices[0]));
    trainer.set_communicator(dist::world());
    if (opt.sync_bn) nn::synchronize_batch_norm(*net, dist::world());
  }
#endif
  const std::int64_t batches = train_loader.num_batches();

  int first_epoch = 1;
  if (!opt.resume.empty()) {
    nn::load_checkpoint(*net, trainer, opt.resume);  // after measure_shares: the saved state wins
    if (trainer.steps() % batches != 0)
      throw std::runtime_error(opt.resume + " was saved after " + std::to_string(trainer.steps()) +
                               " steps, not at the end of an epoch of " + std::to_string(batches) + " batches");
    first_epoch = int(trainer.steps() / batches) + 1;
    train_loader.set_epoch(std::uint64_t(first_epoch - 1));
    std::printf("resumed from %s after epoch %d\n", opt.resume.c_str(), first_epoch - 1);
  }

  std::ofstream csv;
  if (!opt.csv.empty()) {
    csv.open(opt.csv);
    if (!csv) throw std::runtime_error("cannot write " + opt.csv);
    csv << "epoch,loss,train_acc,test_acc,samples_per_s,seconds\n";
  }

  double test_acc = 0;
  for (int epoch = first_epoch; epoch <= opt.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor<float> loss_sum = zeros<float>({}), correct = zeros<float>({});
    // With --clip-norm: the gradients' norms before clipping and how many
    // exceeded the bound, summed without a sync point (read at the epoch's end).
    Tensor<float> norm_sum = zeros<float>({}), clipped = zeros<float>({});
    auto watch_norm = [&](const Tensor<float>& norm) {
      norm_sum = norm_sum + norm.to(cpu());
      clipped = clipped + cast<float>(norm.to(cpu()) > opt.clip_norm);
    };
    std::int64_t seen = 0, seen_here = 0, done = 0;  // rows of every rank / of this one
    for (auto& batch : train_loader) {
      const auto [xs, ys] = split(as_input(batch.x), batch.y);
      std::vector<Tensor<float>> scores(xs.size());
      if (hybrid_step) {
        auto parts = (*hybrid_step)(xs, ys, batch.rows);  // the global batch: every rank's rows
        for (std::size_t d = 0; d < parts.size(); ++d) {
          loss_sum = loss_sum + sum(parts[d].loss).to(cpu());
          scores[d] = std::move(parts[d].scores);
        }
        if (opt.clip_norm > 0) watch_norm(hybrid_step->grad_norm());
      } else {
        {
          autograd::record rec;
          for (std::size_t d = 0; d < xs.size(); ++d) {
            scores[d] = (*net)(xs[d]);
            Tensor<float> loss = loss_fn(scores[d], ys[d]);
            loss.backward();
            loss_sum = loss_sum + sum(loss.detach()).to(cpu());
          }
        }
        if (opt.clip_norm > 0) {
          trainer.allreduce_grads();  // sums the devices' gradients
          watch_norm(nn::clip_global_norm(net->collect_params(), opt.clip_norm));
          trainer.update(batch.rows);
        } else {
          trainer.step(batch.rows);  // sums the devices' (and ranks') gradients first
        }
      }
      for (std::size_t d = 0; d < xs.size(); ++d)
        correct = correct + sum(cast<float>(argmax(scores[d].detach(), 1) == ys[d])).to(cpu());
      seen += batch.rows;
      seen_here += batch.x.shape()[0];
      ++done;
      if (rank == 0 && (done % 20 == 0 || done == batches)) progress(epoch, done, batches, loss_sum.item() / double(seen_here));
    }
    over_ranks(loss_sum);
    over_ranks(correct);
    const double train_loss = loss_sum.item() / double(seen), train_acc = correct.item() / double(seen);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    Tensor<float> test_correct = zeros<float>({});
    std::int64_t test_seen = 0;
    for (auto& batch : test_loader) {
      const auto [xs, ys] = split(as_input(batch.x), batch.y);
      for (std::size_t d = 0; d < xs.size(); ++d)
        test_correct = test_correct + sum(cast<float>(argmax((*net)(xs[d]), 1) == ys[d])).to(cpu());
      test_seen += batch.rows;
    }
    over_ranks(test_correct);
    test_acc = test_correct.item() / double(test_seen);
    if (isatty(fileno(stderr))) std::fprintf(stderr, "\n");
    std::printf("epoch %2d  loss %.4f  train acc %.4f  test acc %.4f  %.0f samples/s (%.1f s)\n", epoch, train_loss,
                train_acc, test_acc, double(seen) / secs, secs);
    if (opt.clip_norm > 0)
      std::printf("          gradient norm before clipping: mean %.3f, above %g in %.0f%% of steps\n",
                  norm_sum.item() / double(batches), double(opt.clip_norm), 100.0 * clipped.item() / double(batches));
    std::fflush(stdout);
    if (csv) csv << epoch << ',' << train_loss << ',' << train_acc << ',' << test_acc << ',' << double(seen) / secs << ','
                 << secs << '\n';
    if (!opt.checkpoint.empty() && rank == 0) nn::save_checkpoint(*net, trainer, opt.checkpoint);
  }
  if (hybrid_step)
    std::printf("hybridized steps: %lld traced, %lld replayed of %lld\n", (long long)hybrid_step->traces(),
                (long long)hybrid_step->replays(), (long long)trainer.steps());
  std::printf("test accuracy: %.4f\n", test_acc);
  for (const Device& d : devices)  // what the GPU's caching pool did (engine::memory_pool_stats)
    if (d.type == DeviceType::gpu) {
      const auto m = engine::memory_pool_stats(d);
      std::printf("%s memory pool: %.1f MiB held, %.1f MiB of it free; %llu hits, %llu misses, %llu cut blocks\n",
                  d.to_string().c_str(), double(m.held_bytes) / (1 << 20), double(m.cached_bytes) / (1 << 20),
                  (unsigned long long)m.hits, (unsigned long long)m.misses, (unsigned long long)m.splits);
    }
#if DEFT_EXAMPLE_DIST
  if (opt.dist) dist::finalize();
#endif
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "\ntrain_fashion_mnist: %s\n", e.what());
  return 1;
}
