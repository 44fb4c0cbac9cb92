// bench's parser of the PyTorch side's replies (tools/ffnlab/torch_reply.cpp), by property: for
// any line — random bytes, valid replies cut short, every JSON type in every field — it returns a
// reply of a valid form or throws ffnlab::Error "[bench] SCRIPT: ...", and nothing else.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ffnlab/error.hpp"
#include "torch_reply.hpp"

namespace ffnlab::test {

namespace {

using cli::TorchReply;

// Parses as a reply and as a hello; checks what comes back or what is thrown.
void check_line(const std::string& line) {
  SCOPED_TRACE(line.substr(0, 80));
  try {
    const TorchReply r = cli::parse_torch_reply(line, "S.py");
    if (r.kind == TorchReply::Kind::seconds) {
      EXPECT_TRUE(std::isfinite(r.seconds));
      EXPECT_GT(r.seconds, 0);
    }
    EXPECT_LE(r.skipped.size(), 203u);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[bench] S.py: ", 0), 0u) << e.what();
  } catch (...) {
    ADD_FAILURE() << "an exception other than ffnlab::Error";
  }
  try {
    const cli::TorchHello h = cli::parse_torch_hello(line, "S.py");
    if (h.ready) {
      EXPECT_GE(h.threads, 0);
    }
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[bench] S.py: ", 0), 0u) << e.what();
  } catch (...) {
    ADD_FAILURE() << "an exception other than ffnlab::Error";
  }
}

}  // namespace

TEST(TorchReply, ValidRepliesAreRead) {
  const TorchReply s = cli::parse_torch_reply(R"({"seconds": 0.25})", "S.py");
  EXPECT_EQ(s.kind, TorchReply::Kind::seconds);
  EXPECT_EQ(s.seconds, 0.25);
  const TorchReply k = cli::parse_torch_reply(R"({"skipped": "too big"})", "S.py");
  EXPECT_EQ(k.kind, TorchReply::Kind::skipped);
  EXPECT_EQ(k.skipped, "too big");
  EXPECT_EQ(cli::parse_torch_reply(R"({"freed": true})", "S.py").kind, TorchReply::Kind::freed);
  const auto h = cli::parse_torch_hello(R"({"ready": true, "torch": "2.1", "threads": 2})", "S.py");
  EXPECT_TRUE(h.ready);
  EXPECT_EQ(h.torch, "2.1");
  EXPECT_EQ(h.threads, 2);
}

TEST(TorchReply, EveryTypeInEveryFieldIsReadOrRefusedByName) {
  const std::vector<std::string> values = {"null",   "true",       "false",
                                           "0",      "-1",         "1e400",
                                           "-0.0",   "3.5",        "18446744073709551616",
                                           "\"x\"",  "[]",         "{}",
                                           "[1, 2]", "{\"a\": 1}", "\"\\u0000\"",
                                           "1e-320"};
  for (const char* key : {"seconds", "skipped", "freed", "ready", "threads", "torch", "error"})
    for (const auto& v : values) {
      check_line(fmt::format("{{\"{}\": {}}}", key, v));
      check_line(fmt::format("{{\"ready\": true, \"threads\": 1, \"{}\": {}}}", key, v));
    }
  EXPECT_THROW(cli::parse_torch_reply(R"({"seconds": "fast"})", "S.py"), Error);
  EXPECT_THROW(cli::parse_torch_reply(R"({"seconds": -1})", "S.py"), Error);
  EXPECT_THROW(cli::parse_torch_reply("[1]", "S.py"), Error);
  EXPECT_THROW(cli::parse_torch_hello(R"({"ready": true, "threads": 1e9})", "S.py"), Error);
}

TEST(TorchReply, RandomAndTruncatedLinesNeverEscapeAsAnythingButError) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> valid = {R"({"seconds": 0.125})", R"({"skipped": "why"})",
                                          R"({"freed": true})",
                                          R"({"ready": true, "torch": "2.1", "threads": 2})"};
  for (const auto& v : valid)
    for (std::size_t n = 0; n <= v.size(); ++n) check_line(v.substr(0, n));
  std::uniform_int_distribution<int> byte(0, 255), len(0, 64);
  const std::string alphabet = "{}[]\":,0123456789.eE+-truefalsnl \\u";
  for (int i = 0; i < 4000; ++i) {
    std::string line;
    const int n = len(rng);
    for (int j = 0; j < n; ++j)
      line += i % 2 ? static_cast<char>(byte(rng))
                    : alphabet[static_cast<std::size_t>(byte(rng)) % alphabet.size()];
    check_line(line);
  }
  // A valid reply with one byte changed.
  for (int i = 0; i < 2000; ++i) {
    std::string line = valid[static_cast<std::size_t>(i) % valid.size()];
    line[static_cast<std::size_t>(byte(rng)) % line.size()] = static_cast<char>(byte(rng));
    check_line(line);
  }
}

}  // namespace ffnlab::test
