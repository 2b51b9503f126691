// Fashion-MNIST (Zalando, https://github.com/zalandoresearch/fashion-mnist):
// 70,000 28x28 grey-scale images of clothing in 10 classes, 60,000 to train
// and 10,000 to test, as four IDX files. Debian's `dataset-fashion-mnist`
// package installs them gzipped in /usr/share/datasets/fashion-mnist.
#pragma once
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../tensor.hpp"
#include "idx.hpp"

namespace deft::data {

/// Which part of the data set: 60,000 training or 10,000 test images.
enum class Split { train, test };
/// How images come out: (N, 28, 28), or one row of 784 pixels per image.
enum class Layout { grid, flat };

/// Class names, indexed by label.
inline constexpr std::array<std::string_view, 10> fashion_mnist_classes = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

/// Where Debian's (and Ubuntu's) dataset-fashion-mnist package puts the files.
inline constexpr std::string_view fashion_mnist_debian_dir = "/usr/share/datasets/fashion-mnist";

/// One split of Fashion-MNIST (training or test) as tensors.
struct FashionMnist {
  Tensor<float> images;         ///< (N, rows, cols) or (N, rows * cols), pixels scaled to [0, 1]
  Tensor<std::int64_t> labels;  ///< (N,), each in 0..9 (an index into fashion_mnist_classes)
  /// N, the number of samples.
  std::int64_t size() const { return labels.size(); }
};

namespace detail {

/// The base names of a split's image and label files (the original names).
inline std::pair<const char*, const char*> fashion_mnist_names(Split split) {
  return split == Split::train ? std::pair{"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}
                               : std::pair{"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
}

/// dir/base if it is a file, else dir/base.gz if that is; nullopt otherwise.
/// The plain file wins: it is what a user who ran gunzip meant.
DEFT_DECL std::optional<std::filesystem::path> find_idx_file(const std::filesystem::path& dir, const char* base);

/// Why `p` cannot be looked at, when it exists but a permission or a loop of
/// links is in the way ("" when it is there or simply absent).
DEFT_DECL std::string unreachable(const std::filesystem::path& p);

/// What is wrong with `dir` as a data directory that lacks `missing` (`if_absent` when it is not there).
DEFT_DECL std::string directory_problem(const std::filesystem::path& dir, const std::string& missing, const char* if_absent);

/// The files `dir` lacks for a complete Fashion-MNIST (both splits), as "a, b".
DEFT_DECL std::string fashion_mnist_missing(const std::filesystem::path& dir);

inline constexpr const char* fashion_mnist_help =
    "To get Fashion-MNIST: `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu; the files go to "
    "/usr/share/datasets/fashion-mnist), or pass --data DIR (or set DEFT_DATA=DIR) for a directory holding "
    "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each "
    "plain or gzipped (.gz), as downloaded from https://github.com/zalandoresearch/fashion-mnist";

}  // namespace detail

/// Reads one split from `dir` (plain or .gz files under their original names).
/// Throws std::runtime_error naming the file and the problem: a missing file,
/// a malformed one (see read_idx), images that are not (N, rows, cols), labels
/// that are not (N,) or lie outside 0..9, or as many labels as images.
DEFT_DECL FashionMnist load_fashion_mnist(const std::filesystem::path& dir, Split split, Layout layout = Layout::grid);

/// The directory to load Fashion-MNIST from. Looks, in order, in
///   1. `user_dir` (say, from --data DIR) or its fashion-mnist subdirectory:
///      when a user_dir is given, the files must be there;
///   2. $DEFT_DATA/fashion-mnist, then $DEFT_DATA itself;
///   3. $FASHION_MNIST_DIR;
///   4. /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
/// A directory qualifies when it holds all four files (each plain or .gz).
/// Otherwise throws std::runtime_error listing every place looked at and what
/// to do about it.
DEFT_DECL std::filesystem::path find_fashion_mnist_dir(const std::optional<std::filesystem::path>& user_dir = std::nullopt);

#if DEFT_DEFINE_RUNTIME
DEFT_DECL std::optional<std::filesystem::path> detail::find_idx_file(const std::filesystem::path& dir, const char* base) {
  std::error_code ec;
  for (const char* suffix : {"", ".gz"}) {
    const auto p = dir / (std::string(base) + suffix);
    if (std::filesystem::is_regular_file(p, ec)) return p;
  }
  return std::nullopt;
}

DEFT_DECL std::string detail::unreachable(const std::filesystem::path& p) {
  std::error_code ec;
  (void)std::filesystem::status(p, ec);
  return ec && ec != std::errc::no_such_file_or_directory ? ec.message() : std::string();
}

DEFT_DECL std::string detail::directory_problem(const std::filesystem::path& dir, const std::string& missing, const char* if_absent) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) {
    const std::string why = unreachable(dir / "x");  // a directory without search permission
    return why.empty() ? "lacks " + missing : "cannot be read: " + why;
  }
  const std::string why = unreachable(dir);
  return why.empty() ? std::string(if_absent) : "cannot be read: " + why;
}

DEFT_DECL std::string detail::fashion_mnist_missing(const std::filesystem::path& dir) {
  std::string missing;
  for (Split s : {Split::train, Split::test}) {
    const auto [img, lbl] = fashion_mnist_names(s);
    for (const char* base : {img, lbl})
      if (!find_idx_file(dir, base)) missing += (missing.empty() ? "" : ", ") + std::string(base);
  }
  return missing;
}

DEFT_DECL FashionMnist load_fashion_mnist(const std::filesystem::path& dir, Split split, Layout layout) {
  const auto [img_name, lbl_name] = detail::fashion_mnist_names(split);
  auto require = [&](const char* base) {
    auto p = detail::find_idx_file(dir, base);
    if (!p) {
      for (const char* suffix : {"", ".gz"})
        if (const auto why = detail::unreachable(dir / (std::string(base) + suffix)); !why.empty())
          deft::detail::raise<std::runtime_error>("load_fashion_mnist: cannot read ", (dir / (std::string(base) + suffix)).string(),
                                                  ": ", why);
      deft::detail::raise<std::runtime_error>("load_fashion_mnist: ", dir.string(), " has no ", base, " (nor ", base,
                                              ".gz). ", detail::fashion_mnist_help);
    }
    return *p;
  };
  const auto img_path = require(img_name), lbl_path = require(lbl_name);
  IdxArray img = read_idx(img_path);
  IdxArray lbl = read_idx(lbl_path);
  if (img.dims.size() != 3)
    deft::detail::raise<std::runtime_error>(img_path.string(), ": expected images of shape (N, rows, cols), found shape ",
                                            img.shape().to_string());
  if (lbl.dims.size() != 1)
    deft::detail::raise<std::runtime_error>(lbl_path.string(), ": expected labels of shape (N,), found shape ",
                                            lbl.shape().to_string());
  const std::int64_t n = img.dims[0];
  if (lbl.dims[0] != n)
    deft::detail::raise<std::runtime_error>("load_fashion_mnist: ", img_path.string(), " has ", n, " images but ",
                                            lbl_path.string(), " has ", lbl.dims[0], " labels");

  std::vector<std::int64_t> labels(lbl.data.begin(), lbl.data.end());
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= std::int64_t(fashion_mnist_classes.size()))
      deft::detail::raise<std::runtime_error>(lbl_path.string(), ": label ", labels[i], " of sample ", i,
                                              " is outside 0..9");
  std::vector<float> pixels(img.data.size());
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = float(img.data[i]) / 255.0f;
  const Shape shape = layout == Layout::grid ? img.shape() : Shape{n, img.dims[1] * img.dims[2]};
  return FashionMnist{Tensor<float>(std::move(pixels), shape), Tensor<std::int64_t>(std::move(labels), Shape{n})};
}

DEFT_DECL std::filesystem::path find_fashion_mnist_dir(const std::optional<std::filesystem::path>& user_dir) {
  if (user_dir) {
    const std::string missing = detail::fashion_mnist_missing(*user_dir);
    if (missing.empty()) return *user_dir;
    if (detail::fashion_mnist_missing(*user_dir / "fashion-mnist").empty()) return *user_dir / "fashion-mnist";
    deft::detail::raise<std::runtime_error>("Fashion-MNIST: the data directory ", user_dir->string(), " ",
                                            detail::directory_problem(*user_dir, missing, "is not a directory"), ". ",
                                            detail::fashion_mnist_help);
  }
  std::string looked;  // one line per place, for the error
  std::vector<std::pair<std::string, std::filesystem::path>> places;  // (how it was chosen, where)
  if (const char* root = std::getenv("DEFT_DATA"); root && *root) {
    places.emplace_back("$DEFT_DATA/fashion-mnist", std::filesystem::path(root) / "fashion-mnist");
    places.emplace_back("$DEFT_DATA", root);
  } else {
    looked += "\n  $DEFT_DATA: not set";
  }
  if (const char* d = std::getenv("FASHION_MNIST_DIR"); d && *d) places.emplace_back("$FASHION_MNIST_DIR", d);
  else looked += "\n  $FASHION_MNIST_DIR: not set";
  places.emplace_back("the dataset-fashion-mnist package's directory", std::filesystem::path(fashion_mnist_debian_dir));
  for (const auto& [how, dir] : places) {
    const std::string missing = detail::fashion_mnist_missing(dir);
    if (missing.empty()) return dir;
    looked += "\n  " + dir.string() + " (" + how + "): " + detail::directory_problem(dir, missing, "no such directory");
  }
  deft::detail::raise<std::runtime_error>("Fashion-MNIST not found. Looked at:", looked, "\n", detail::fashion_mnist_help);
}
#endif

}  // namespace deft::data
