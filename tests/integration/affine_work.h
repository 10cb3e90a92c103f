// One session's work for tests against a daemon: a captured graph, out = in * 2 + pos over
// kN floats with in = 0, 1, 2, ..., replayed over the session's stream with `out` read back
// and checked.
#ifndef REPLAYD_TESTS_INTEGRATION_AFFINE_WORK_H_
#define REPLAYD_TESTS_INTEGRATION_AFFINE_WORK_H_

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/integration/daemon_fixture.h"

namespace replayd::client {

inline constexpr int kN = 256;
inline const Variable kPos{"pos", 0, 1 << 20, 1};

class Work {
 public:
  // `code`: the affine kernel's source, which a test may vary (a comment) to make a
  // program of another compile key.
  static absl::StatusOr<std::unique_ptr<Work>> Begin(Client& client, const std::string& code = kAffineSource) {
    absl::StatusOr<Session> session = client.OpenSession("cpu:0");
    if (!session.ok()) return session.status();
    auto work = std::unique_ptr<Work>(new Work(std::move(*session)));
    if (absl::Status s = work->Prepare(code); !s.ok()) return s;
    return work;
  }

  std::future<absl::StatusOr<ReplayResult>> ReplayAsync(int64_t pos) {
    return session_.ReplayAsync(graph_, {&in_, &out_, pos}, true, {View{&out_}});
  }

  // OK when `result` holds out for `pos`; else what differs.
  static absl::Status Check(const absl::StatusOr<ReplayResult>& result, int64_t pos) {
    if (!result.ok()) return result.status();
    if (result->reads.size() != 1 || result->reads[0].size() != kN * sizeof(float))
      return absl::InternalError("the replay read back the wrong bytes");
    std::vector<float> out(kN);
    std::memcpy(out.data(), result->reads[0].data(), kN * sizeof(float));
    for (int i = 0; i < kN; ++i)
      if (out[i] != static_cast<float>(2 * i + pos))
        return absl::InternalError(absl::StrCat("pos ", pos, ": out[", i, "] is ", out[i]));
    return absl::OkStatus();
  }

  absl::Status ReplayAndCheck(int64_t pos) { return Check(ReplayAsync(pos).get(), pos); }
  absl::Status Close() { return session_.Close(); }

  Session& session() { return session_; }
  const Program& program() const { return affine_; }
  const Graph& graph() const { return graph_; }
  const Buffer& in() const { return in_; }
  const Buffer& out() const { return out_; }

 private:
  explicit Work(Session session) : session_(std::move(session)) {}

  absl::Status Prepare(const std::string& code) {
    absl::StatusOr<Program> affine =
        session_.Load({"cpu-c", code, "affine", *ParseSignature("out,in,int32,int32"), {}});
    absl::StatusOr<Buffer> in = session_.Alloc(kN * 4), out = session_.Alloc(kN * 4);
    if (!affine.ok()) return affine.status();
    if (!in.ok()) return in.status();
    if (!out.ok()) return out.status();
    affine_ = std::move(*affine);
    in_ = std::move(*in);
    out_ = std::move(*out);
    std::vector<float> ramp(kN);
    for (int i = 0; i < kN; ++i) ramp[i] = static_cast<float>(i);
    if (absl::Status s = session_.WriteVector(in_, ramp); !s.ok()) return s;
    if (absl::Status s = session_.BeginCapture({&in_}, {kPos}); !s.ok()) return s;
    LaunchSpec spec;
    spec.args = {View{&out_}, View{&in_}, int64_t{kN}, Expr{"pos"}};
    spec.variables = {{kPos, 0}};
    if (absl::Status s = session_.Launch(affine_, spec).status(); !s.ok()) return s;
    absl::StatusOr<Graph> graph = session_.EndCapture({&out_});
    if (!graph.ok()) return graph.status();
    graph_ = std::move(*graph);
    return absl::OkStatus();
  }

  Session session_;
  Program affine_;
  Buffer in_, out_;
  Graph graph_;
};

}  // namespace replayd::client

#endif  // REPLAYD_TESTS_INTEGRATION_AFFINE_WORK_H_
