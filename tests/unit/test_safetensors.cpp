// safetensors: round trips, conversions, and every kind of malformed file rejected cleanly.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/io/safetensors.hpp"

using namespace ffnlab;

namespace {

std::vector<std::byte> file_of(const std::string& header, std::size_t data_bytes,
                               std::int64_t declared_len = -1) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  std::uint64_t n = declared_len < 0 ? header.size() : static_cast<std::uint64_t>(declared_len);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void expect_rejected(const std::vector<std::byte>& bytes, const std::string& fragment) {
  try {
    SafeTensors::parse(bytes, "bad.safetensors");
    ADD_FAILURE() << "accepted a file that should fail with '" << fragment << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("[safetensors] bad.safetensors: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

}  // namespace

TEST(SafeTensors, RoundTripsAllDtypes) {
  const Tensor a = test::random_tensor({3, 5}, 1);
  const Tensor b = test::random_tensor({7}, 2);
  SafeTensorsWriter w;
  w.add("a", a);
  w.add("b16", b, StDType::bf16);
  w.add("b16_native", b.to(DType::bf16));
  w.add_ints("i", {2, 2}, {1, -2, 3, 1LL << 40});
  w.add_ints("j", {3}, {7, -8, 9}, StDType::i32);
  w.set_metadata("format", "pt");
  const auto st = SafeTensors::parse(w.serialize(), "mem");
  EXPECT_EQ(st.names(), (std::vector<std::string>{"a", "b16", "b16_native", "i", "j"}));
  EXPECT_EQ(st.metadata().at("format"), "pt");
  const Tensor a2 = st.f32("a");
  EXPECT_EQ(a2.shape(), a.shape());
  EXPECT_EQ(std::memcmp(a2.f32(), a.f32(), a.nbytes()), 0);
  const Tensor b2 = st.f32("b16");
  for (int i = 0; i < 7; ++i) EXPECT_EQ(b2.f32()[i], bf16_to_f32(f32_to_bf16(b.f32()[i])));
  EXPECT_EQ(st.info("b16_native").dtype, StDType::bf16);
  EXPECT_EQ(st.ints("i"), (std::vector<std::int64_t>{1, -2, 3, 1LL << 40}));
  EXPECT_EQ(st.ints("j"), (std::vector<std::int64_t>{7, -8, 9}));
  EXPECT_THROW(st.f32("i"), Error);
  EXPECT_THROW(st.f32("missing"), Error);
}

// Tensors with no elements (an MoE's routing of a layer that chooses nothing: [T, 0]) are
// written and read back, in every stored type, without handing memcpy a null pointer (the
// sanitizer build makes that fatal).
TEST(SafeTensors, RoundTripsEmptyTensors) {
  SafeTensorsWriter w;
  const Tensor empty = Tensor::from({3, 0}, {});
  w.add("f32", empty);
  w.add("bf16", empty, StDType::bf16);
  w.add("bf16_source", empty.to(DType::bf16));
  w.add_ints("ints", {3, 0}, {});
  const auto st = SafeTensors::parse(w.serialize(), "mem");
  for (const char* name : {"f32", "bf16", "bf16_source"}) {
    EXPECT_EQ(st.f32(name).shape(), (Shape{3, 0})) << name;
  }
  EXPECT_TRUE(st.contains("ints"));
  // A huge dimension beside a 0 is still no elements; a dimension past int64 is refused.
  const auto huge = SafeTensors::parse(
      file_of(R"({"e":{"dtype":"F32","shape":[1099511627776,0],"data_offsets":[0,0]}})", 0), "e");
  EXPECT_EQ(huge.f32("e").numel(), 0);
  expect_rejected(
      file_of(R"({"e":{"dtype":"F32","shape":[18446744073709551615,0],"data_offsets":[0,0]}})", 0),
      "shape larger than the file");
}

TEST(SafeTensors, ReadsF16) {
  // 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), -0.0
  const std::uint16_t h[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000};
  auto bytes = file_of(R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]}})", 10);
  std::memcpy(bytes.data() + bytes.size() - 10, h, 10);
  const Tensor t = SafeTensors::parse(bytes, "f16").f32("h");
  EXPECT_EQ(t.f32()[0], 1.0f);
  EXPECT_EQ(t.f32()[1], -2.0f);
  EXPECT_EQ(t.f32()[2], 65504.0f);
  EXPECT_EQ(t.f32()[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::signbit(t.f32()[4]));
}

TEST(SafeTensors, RejectsMalformedFiles) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(SafeTensors::parse(file_of(ok, 8), "bad.safetensors"));
  expect_rejected(std::vector<std::byte>(5), "too short");
  expect_rejected(file_of(ok, 8, 1LL << 40), "absurd");
  expect_rejected(file_of(ok, 8, static_cast<std::int64_t>(ok.size() + 9)), "past the end");
  auto truncated = file_of(ok, 8);
  truncated.resize(truncated.size() - 3);
  expect_rejected(truncated, "run past");
  expect_rejected(file_of("{not json", 0), "not valid JSON");
  expect_rejected(file_of("[1,2]", 0), "not a JSON object");
  expect_rejected(file_of(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
                  "unsupported dtype 'F64'");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                  "needs 12 bytes");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                  "run past");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
                  "overlaps");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                  "gap of 4 bytes");
  expect_rejected(file_of(ok, 12), "4 bytes of data after");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                  "non-integer dimension");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "needs dtype, shape");
  expect_rejected(
      file_of(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      "larger than the file");
  expect_rejected(file_of(R"({"__metadata__":{"k":1}})", 0), "not a string");
  // Read without a JSON tree: every place where the format has no value of a kind is refused at
  // once, and an entry's keys outside the format are skipped whole.
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                          8),
                  "tensor 'a' appears twice");
  expect_rejected(file_of(R"({"a":[1]})", 0), "needs dtype, shape and data_offsets");
  expect_rejected(file_of(R"({"__metadata__":[1]})", 0), "__metadata__ is not an object");
  expect_rejected(file_of(R"({"__metadata__":{"k":{"x":1}}})", 0), "metadata 'k' is not a string");
  expect_rejected(file_of(R"({"a":{"dtype":["F32"],"shape":[2],"data_offsets":[0,8]}})", 8),
                  "non-string dtype");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":{"n":2},"data_offsets":[0,8]}})", 8),
                  "invalid shape");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],)"
                          R"("data_offsets":[0,8]}})",
                          8),
                  "invalid shape");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", 8),
                  "non-integer dimension");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8),
                  "invalid data_offsets");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
                  "invalid data_offsets");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"shape":[3],"data_offsets":[0,24]}})",
                          24),
                  "tensor 'a' has 'shape' twice");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                          8),
                  "has 'dtype' twice");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],)"
                          R"("data_offsets":[0,8]}})",
                          8),
                  "has 'data_offsets' twice");
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,1e400]}})", 8),
                  "not valid JSON (number overflow");
  const auto skipped = SafeTensors::parse(
      file_of(R"({"a":{"x":{"y":[1,{"z":[]}]},"dtype":"F32","shape":[2],"data_offsets":[0,8],)"
              R"("w":"v"},"__metadata__":{"format":"pt"}})",
              8),
      "ok.safetensors");
  EXPECT_EQ(skipped.names(), std::vector<std::string>{"a"});
  EXPECT_EQ(skipped.metadata().at("format"), "pt");
}

TEST(SafeTensors, WritesManyTensorsInLinearTimeAndReadsThemBack) {
  // 2^18 tensors (a 65,536-expert layer with its Adam state has 600,000): a header that looked
  // each name up among those before it took minutes; this one takes a second or so.
  constexpr int kCount = 1 << 18;
  SafeTensorsWriter w;
  const Tensor t = test::random_tensor({2}, 3);
  for (int i = 0; i < kCount; ++i) w.add_view(fmt::format("experts.{}.w", i), t);
  w.set_metadata("format", "pt");
  const auto bytes = w.serialize();
  const auto back = SafeTensors::parse(bytes, "many.safetensors");
  ASSERT_EQ(back.names().size(), static_cast<std::size_t>(kCount));
  EXPECT_EQ(back.names()[12345], "experts.12345.w");
  EXPECT_EQ(back.f32("experts.4321.w").f32()[1], t.f32()[1]);
  EXPECT_EQ(back.metadata().at("format"), "pt");
  // The header is what a JSON library writes: no spaces, entries in the order they came.
  const std::string head(reinterpret_cast<const char*>(bytes.data()) + 8, 120);
  EXPECT_EQ(head.rfind(R"({"__metadata__":{"format":"pt"},"experts.0.w":{"dtype":"F32",)"
                       R"("shape":[2],"data_offsets":[0,8]},"experts.1.w")",
                       0),
            0u)
      << head;
  SafeTensorsWriter twice;
  twice.add("a", t);
  twice.add("a", t);
  EXPECT_THROW(twice.serialize(), Error);
}

TEST(SafeTensors, MappedDataStaysReadableWhileTheObjectLives) {
  // A mapped file's tensors are read after the loader returned, and copy_f32 converts in place.
  const auto path = std::filesystem::temp_directory_path() / "ffnlab_st_mmap.safetensors";
  const Tensor a = test::random_tensor({5, 3}, 9);
  SafeTensorsWriter w;
  w.add("a", a, StDType::bf16);
  w.write(path.string());
  Tensor dst({15});
  {
    const SafeTensors st = SafeTensors::load(path.string());
    std::filesystem::remove(path);  // the mapping keeps the data readable
    st.copy_f32("a", dst);
    Tensor wrong({14});
    EXPECT_THROW(st.copy_f32("a", wrong), Error);
  }
  for (int i = 0; i < 15; ++i) EXPECT_EQ(dst.f32()[i], bf16_to_f32(f32_to_bf16(a.f32()[i])));
}

TEST(SafeTensors, WriteIsAtomicAndFailsCleanly) {
  const auto dir = std::filesystem::temp_directory_path() / "ffnlab_st_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "t.safetensors").string();
  SafeTensorsWriter w;
  w.add("x", test::random_tensor({4, 4}, 3));
  w.write(path);
  EXPECT_EQ(SafeTensors::load(path).f32("x").numel(), 16);
  EXPECT_THROW(w.write((dir / "no_such_dir" / "t.safetensors").string()), Error);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_THROW(SafeTensors::load((dir / "missing.safetensors").string()), Error);
  std::ofstream(dir / "empty.safetensors").close();
  try {
    SafeTensors::load((dir / "empty.safetensors").string());
    ADD_FAILURE() << "accepted an empty file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too short"), std::string::npos) << e.what();
  }
  try {
    SafeTensors::load(dir.string());
    ADD_FAILURE() << "accepted a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(SafeTensors, AWriteAStopRequestOutlastsIsAbandonedAndKeepsTheEarlierFile) {
  const auto dir = std::filesystem::temp_directory_path() / "ffnlab_st_stop";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "t.safetensors").string();
  SafeTensorsWriter before;
  before.add("x", test::random_tensor({4}, 1));
  before.write(path);
  const auto earlier = SafeTensors::load(path).f32("x");
  SafeTensorsWriter w;
  for (int i = 0; i < 100; ++i) w.add(fmt::format("t{}", i), test::random_tensor({64}, i));
  const double grace = write_stop_grace();
  // A request inside the grace: the write goes on (the stop's own checkpoint is written).
  request_stop(0);
  EXPECT_NO_THROW(w.write((dir / "within.safetensors").string()));
  // A write that begins after the grace has passed since the request gets a grace of its own:
  // the checkpoint a stop asks for, after a long step, is still written.
  set_write_stop_grace(0.2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_NO_THROW(w.write((dir / "late.safetensors").string()));
  // Past it: abandoned, the temporary removed, the earlier file as it was.
  set_write_stop_grace(0);
  EXPECT_THROW(w.write(path), Interrupted);
  clear_stop();
  set_write_stop_grace(grace);
  EXPECT_EQ(SafeTensors::load(path).f32("x").f32()[3], earlier.f32()[3]);
  EXPECT_EQ(SafeTensors::load(path).names().size(), 1u);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_THROW(set_write_stop_grace(-1), Error);
  std::filesystem::remove_all(dir);
}
