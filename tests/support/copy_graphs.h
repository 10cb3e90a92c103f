// Device graphs of copies only, through a daemon on loopback: for the fake GPU drivers
// (fake_cuda, fake_hip), whose kernels do not run but whose memcpy nodes do, and which
// check every node against the live allocations at creation, at each retargeting and at
// each launch: no node may be built on a placeholder address the driver does not know.
#ifndef REPLAYD_TESTS_SUPPORT_COPY_GRAPHS_H_
#define REPLAYD_TESTS_SUPPORT_COPY_GRAPHS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "client/client.h"
#include "tests/support/graph_def.h"
#include "tests/support/status_macros.h"

namespace replayd::testing {

namespace copy_graphs {

inline std::vector<float> Iota(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

inline std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// A buffer of `bytes` in `s`; an empty one (and a failure) when it cannot be made.
inline client::Buffer Alloc(client::Session& s, uint64_t bytes) {
  absl::StatusOr<client::Buffer> b = s.Alloc(bytes);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : client::Buffer();
}

}  // namespace copy_graphs

// Copies on every kind of slot, defined explicitly, of `n` floats each: parameter to
// internal, internal to internal, internal to a parameter at an offset, constant to
// parameter, parameter to parameter, all in one device graph. Replayed on fresh buffers,
// twice, each result checked.
inline void CheckACopyGraphOnEveryKindOfSlot(client::Session& s, int64_t n) {
  using copy_graphs::Alloc, copy_graphs::Iota, copy_graphs::Floats;
  const uint64_t bytes = n * 4;
  client::Buffer weights = Alloc(s, bytes);
  ASSERT_OK(s.WriteVector(weights, Iota(n, 1000)));
  GraphDefBuilder builder;
  v1::GraphDef& def = builder.def();
  const uint32_t kIn = builder.Slot(v1::Slot::PARAMETER, bytes), kOut = builder.Slot(v1::Slot::PARAMETER, 2 * bytes),
                 kOut2 = builder.Slot(v1::Slot::PARAMETER, bytes), kT = builder.Slot(v1::Slot::INTERNAL, bytes),
                 kU = builder.Slot(v1::Slot::INTERNAL, bytes),
                 kC = builder.Slot(v1::Slot::CONSTANT, bytes, weights.handle());
  auto copy = [&](uint32_t dst, uint64_t dst_offset, uint32_t src) { builder.Copy(dst, dst_offset, src, bytes); };
  copy(kT, 0, kIn);       // parameter -> internal
  copy(kU, 0, kT);        // internal -> internal
  copy(kOut, bytes, kU);  // internal -> parameter, at an offset
  copy(kOut, 0, kC);      // constant -> parameter
  copy(kOut2, 0, kIn);    // parameter -> parameter
  ASSERT_OK_AND_ASSIGN(client::Graph graph, s.DefineGraph(def));
  EXPECT_EQ(graph.info().calls(), 5u);
  EXPECT_EQ(graph.info().batches(), 1u) << "every copy a node of one device graph";
  for (float seed : {1.0f, 5000.0f}) {
    client::Buffer in = Alloc(s, bytes), out = Alloc(s, 2 * bytes), out2 = Alloc(s, bytes);
    ASSERT_OK(s.WriteVector(in, Iota(n, seed)));
    ASSERT_OK_AND_ASSIGN(client::ReplayResult r, s.Replay(graph, {&in, &out, &out2}, /*wait=*/true,
                                                          {client::View{&out}, client::View{&out2}}));
    ASSERT_EQ(r.reads.size(), 2u);
    std::vector<float> want = Iota(n, 1000);
    const std::vector<float> in_values = Iota(n, seed);
    want.insert(want.end(), in_values.begin(), in_values.end());
    EXPECT_EQ(Floats(r.reads[0]), want) << "seed " << seed;
    EXPECT_EQ(Floats(r.reads[1]), in_values) << "seed " << seed;
  }
}

// The same kind of graph from a capture: a buffer made and dropped inside it becomes an
// internal, the weights a constant.
inline void CheckACapturedCopyChain(client::Session& s, int64_t n) {
  using client::View, copy_graphs::Alloc, copy_graphs::Iota, copy_graphs::Floats;
  const uint64_t bytes = n * 4;
  client::Buffer in = Alloc(s, bytes), out = Alloc(s, 2 * bytes), weights = Alloc(s, bytes);
  ASSERT_OK(s.WriteVector(weights, Iota(n, 100)));
  ASSERT_OK(s.WriteVector(in, Iota(n, 0)));
  ASSERT_OK(s.BeginCapture({&in}, {}));
  {
    client::Buffer t = Alloc(s, bytes);
    ASSERT_OK(s.Copy(View{&t}, View{&in}).status());
    ASSERT_OK(s.Copy(View{&out, bytes, bytes}, View{&t}).status());
    ASSERT_OK(s.Copy(View{&out, 0, bytes}, View{&weights}).status());
  }
  ASSERT_OK_AND_ASSIGN(client::Graph graph, s.EndCapture({&out}));
  EXPECT_EQ(graph.info().calls(), 3u);
  EXPECT_EQ(graph.info().arena_bytes(), bytes) << "t became an internal";
  for (float seed : {3.0f, 77.0f}) {
    client::Buffer fresh_in = Alloc(s, bytes), fresh_out = Alloc(s, 2 * bytes);
    ASSERT_OK(s.WriteVector(fresh_in, Iota(n, seed)));
    ASSERT_OK_AND_ASSIGN(client::ReplayResult r, s.Replay(graph, {&fresh_in, &fresh_out}, true, {View{&fresh_out}}));
    std::vector<float> want = Iota(n, 100);
    const std::vector<float> in_values = Iota(n, seed);
    want.insert(want.end(), in_values.begin(), in_values.end());
    ASSERT_EQ(r.reads.size(), 1u);
    EXPECT_EQ(Floats(r.reads[0]), want) << "seed " << seed;
  }
}

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_COPY_GRAPHS_H_
