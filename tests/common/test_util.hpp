// Helpers shared by the tests: random data, error measures, central differences.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ffnlab/error.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab::test {

// An empty folder of one test's own under the system's temporary folder, removed with everything
// in it when it goes out of scope (kept when FFNLAB_KEEP_TEST_FILES is set, to look at what a
// test wrote).
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& what)
      : path(std::filesystem::temp_directory_path() /
             ("ffnlab-test-" + what + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (!std::getenv("FFNLAB_KEEP_TEST_FILES")) std::filesystem::remove_all(path);
  }
};

inline Tensor random_tensor(Shape shape, std::uint64_t seed, float scale = 1.0f) {
  Tensor t(std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
  return t;
}

template <typename T>
std::vector<T> to_vector(const Tensor& t) {
  return std::vector<T>(t.f32(), t.f32() + t.numel());
}

// max |a - b| / max(1e-30, max |b|): the error relative to the reference's scale.
template <typename A, typename B>
double scaled_error(const A* a, const B* b, std::int64_t n) {
  double err = 0, scale = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / std::max(scale, 1e-30);
}

// Expects |analytic - numeric| <= atol + rtol·|numeric| for the central difference
// (L(θ+h) - L(θ-h)) / 2h of every listed coordinate of θ. L is evaluated in double.
inline void expect_gradient(std::vector<double>& theta, const std::vector<double>& analytic,
                            const std::function<double()>& loss, const std::vector<std::size_t>& at,
                            double atol, double rtol, const char* what, double h = 1e-6) {
  for (std::size_t i : at) {
    const double saved = theta[i];
    theta[i] = saved + h;
    const double up = loss();
    theta[i] = saved - h;
    const double down = loss();
    theta[i] = saved;
    const double numeric = (up - down) / (2 * h);
    EXPECT_LE(std::fabs(analytic[i] - numeric), atol + rtol * std::fabs(numeric))
        << what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric;
  }
}

// Up to `count` indices spread over [0, n).
inline std::vector<std::size_t> sample_indices(std::size_t n, std::size_t count) {
  std::vector<std::size_t> out;
  const std::size_t step = std::max<std::size_t>(1, n / count);
  for (std::size_t i = 0; i < n; i += step) out.push_back(i);
  if (!out.empty() && out.back() != n - 1) out.push_back(n - 1);
  return out;
}

// The message of the ffnlab::Error that f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Waits for the child `pid` for at most `limit`; past it, kills it (SIGKILL) and reaps it. Returns
// whether it ended by itself; `raw` is its wait status either way.
inline bool wait_or_kill(pid_t pid, int& raw, std::chrono::seconds limit) {
  const auto t0 = std::chrono::steady_clock::now();
  while (::waitpid(pid, &raw, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > limit) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &raw, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace ffnlab::test
