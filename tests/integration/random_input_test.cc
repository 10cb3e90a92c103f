// Randomized bad input over the wire: thousands of malformed requests mixing valid and
// invalid handles, sizes, offsets, enums, expressions and graph definitions. The daemon
// must answer each with a status a client can act on (never INTERNAL or UNKNOWN), keep
// serving, and give back all memory once the sessions close.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

class RandomInputTest : public DaemonFixture {
 protected:
  uint64_t Pick(std::initializer_list<uint64_t> values) {
    std::vector<uint64_t> v(values);
    return v[rng_() % v.size()];
  }
  uint64_t Size() { return Pick({0, 1, 3, 4, 64, 4096, 1ull << 20, 1ull << 40, 1ull << 62, ~0ull, rng_()}); }
  int64_t Int() {
    return static_cast<int64_t>(
        Pick({0, 1, 2, 255, 256, 257, 0x7fffffffull, 0x80000000ull, ~0ull, 1ull << 63, rng_()}));
  }
  uint64_t Handle(const std::vector<uint64_t>& valid) {
    if (!valid.empty() && rng_() % 3) return valid[rng_() % valid.size()];
    return Pick({0, 1, 2, 99, ~0ull, rng_()});
  }

  void RandomExpr(v1::Expr* e, int depth) {
    switch (rng_() % (depth > 6 ? 3 : 5)) {
      case 0:
        e->set_constant(Int());
        break;
      case 1:
        e->set_variable(Pick({0, 1}) ? "pos" : "nope");
        break;
      case 2: {
        static const char* texts[] = {"pos",
                                      "(pos+31)//32",
                                      "pos // (pos - 1)",
                                      "pos * 99999999999",
                                      "min(pos,",
                                      "",
                                      "pos % 0",
                                      "max(pos, 3) - 2",
                                      "-pos"};
        e->set_text(texts[rng_() % 9]);
        break;
      }
      default: {
        v1::BinaryExpr* b = e->mutable_binary();
        b->set_op(static_cast<v1::BinaryExpr::Op>(rng_() % 10));
        RandomExpr(b->mutable_lhs(), depth + 1);
        if (rng_() % 8) RandomExpr(b->mutable_rhs(), depth + 1);
      }
    }
  }

  void RandomVariable(v1::Variable* v) {
    v->set_name(Pick({0, 1, 2}) ? "pos" : (rng_() % 2 ? "" : "9bad"));
    v->set_min(Int() % 512);
    v->set_max(Int() % 512);
    v->set_multiple_of(Int() % 8);
  }

  void RandomArg(v1::Arg* a, const std::vector<uint64_t>& buffers) {
    switch (rng_() % 4) {
      case 0:
        a->set_int_value(Int());
        break;
      case 1:
        RandomExpr(a->mutable_expr(), 0);
        break;
      case 2:
        break;  // no value
      default:
        a->mutable_view()->set_buffer(Handle(buffers));
        a->mutable_view()->set_offset(Size() % 8192);
        a->mutable_view()->set_length(Size() % 8192);
    }
  }

  std::mt19937_64 rng_{1234};
};

#define EXPECT_USABLE(status)                                                            \
  do {                                                                                   \
    grpc::Status s_ = (status);                                                          \
    ++codes[s_.error_code()];                                                            \
    EXPECT_NE(s_.error_code(), grpc::StatusCode::INTERNAL) << s_.error_message();        \
    EXPECT_NE(s_.error_code(), grpc::StatusCode::UNKNOWN) << s_.error_message();         \
    EXPECT_NE(s_.error_code(), grpc::StatusCode::UNAVAILABLE) << "the daemon went away"; \
  } while (0)

TEST_F(RandomInputTest, TheDaemonAnswersEveryMalformedRequestAndLeaksNothing) {
  const uint64_t baseline = FreeMemory();
  std::map<grpc::StatusCode, int> codes;
  {
    Session s = Open();
    std::vector<Buffer> owned;
    std::vector<uint64_t> buffers, programs, graphs;
    for (uint64_t bytes : {64, 1024, 4096}) {
      owned.push_back(*s.Alloc(bytes));
      buffers.push_back(owned.back().handle());
    }
    auto program = s.Load(AddSpec());
    ASSERT_TRUE(program.ok());
    programs.push_back(program->handle());
    for (int i = 0; i < 3000; ++i) {
      grpc::ClientContext ctx;
      switch (rng_() % 7) {
        case 0: {
          v1::LaunchRequest r;
          r.set_session(s.id());
          r.set_program(Handle(programs));
          for (int a = rng_() % 7; a > 0; --a) RandomArg(r.add_args(), buffers);
          for (int d = rng_() % 4; d > 0; --d) {
            if (rng_() % 2)
              r.add_global(Size() % 100000);
            else
              RandomExpr(r.add_global_expr(), 0);
          }
          if (rng_() % 3 == 0) r.add_local(Size() % 4);
          for (int v = rng_() % 3; v > 0; --v) {
            auto* bv = r.add_variables();
            RandomVariable(bv->mutable_variable());
            bv->set_value(Int() % 600);
          }
          v1::LaunchReply reply;
          EXPECT_USABLE(stub().Launch(&ctx, r, &reply));
          break;
        }
        case 1: {
          v1::DefineGraphRequest r;
          r.set_session(s.id());
          v1::GraphDef* g = r.mutable_graph();
          for (int v = rng_() % 3; v > 0; --v) RandomVariable(g->add_variables());
          for (int k = rng_() % 4; k > 0; --k) {
            auto* slot = g->add_slots();
            slot->set_kind(static_cast<v1::Slot::Kind>(rng_() % 5));
            slot->set_bytes(Size() % 10000);
            slot->set_buffer(Handle(buffers));
          }
          for (int c = rng_() % 4; c > 0; --c) {
            auto* call = g->add_calls();
            if (rng_() % 4 == 0) {  // a copy, sometimes with a program or an argument too
              for (v1::SlotView* v : {call->mutable_copy()->mutable_dst(), call->mutable_copy()->mutable_src()}) {
                v->set_slot(rng_() % 5);
                v->set_offset(Size() % 5000);
                v->set_length(Size() % 5000);
              }
              if (rng_() % 4 == 0) call->set_program(Handle(programs));
              if (rng_() % 4 == 0) call->add_args();
              continue;
            }
            call->set_program(Handle(programs));
            for (int a = rng_() % 7; a > 0; --a) {
              auto* arg = call->add_args();
              if (rng_() % 2) {
                arg->mutable_view()->set_slot(rng_() % 6);
                arg->mutable_view()->set_offset(Size() % 5000);
                arg->mutable_view()->set_length(Size() % 5000);
              } else if (rng_() % 4) {
                RandomExpr(arg->mutable_expr(), 0);
              }
            }
            for (int d = rng_() % 4; d > 0; --d) RandomExpr(call->add_global(), 0);
          }
          v1::GraphReply reply;
          grpc::Status st = stub().DefineGraph(&ctx, r, &reply);
          EXPECT_USABLE(st);
          if (st.ok()) graphs.push_back(reply.graph());
          break;
        }
        case 2: {
          v1::ReplayGraphRequest r;
          r.set_session(s.id());
          r.set_graph(Handle(graphs));
          for (int p = rng_() % 5; p > 0; --p) {
            if (rng_() % 2)
              r.add_params()->set_buffer(Handle(buffers));
            else if (rng_() % 4)
              r.add_params()->set_int_value(Int() % 600);
            else
              r.add_params();
          }
          for (int k = rng_() % 3; k > 0; --k) {
            auto* v = r.add_reads();
            v->set_buffer(Handle(buffers));
            v->set_offset(Size() % 8192);
            v->set_length(Size());
          }
          v1::ReplayGraphReply reply;
          EXPECT_USABLE(stub().ReplayGraph(&ctx, r, &reply));
          break;
        }
        case 3: {
          v1::ReadBufferRequest r;
          r.set_session(s.id());
          r.set_buffer(Handle(buffers));
          r.set_offset(Size());
          r.set_length(Size() % (8 << 20));
          auto reader = stub().ReadBuffer(&ctx, r);
          v1::ReadChunk chunk;
          while (reader->Read(&chunk)) {
          }
          EXPECT_USABLE(reader->Finish());
          break;
        }
        case 4: {
          v1::WriteBufferReply reply;
          auto writer = stub().WriteBuffer(&ctx, &reply);
          for (int k = rng_() % 3; k > 0; --k) {
            v1::WriteChunk c;
            c.set_session(rng_() % 8 ? s.id() : rng_());
            c.set_buffer(Handle(buffers));
            c.set_offset(Size());
            c.set_data(std::string(Size() % 5000, 'z'));
            if (!writer->Write(c)) break;
          }
          writer->WritesDone();
          EXPECT_USABLE(writer->Finish());
          break;
        }
        case 5: {
          v1::CopyBufferRequest r;
          r.set_session(s.id());
          for (v1::View* v : {r.mutable_dst(), r.mutable_src()}) {
            if (rng_() % 8 == 0) continue;  // no view
            v->set_buffer(Handle(buffers));
            v->set_offset(Size() % 8192);
            v->set_length(Size() % 8192);
          }
          if (rng_() % 8 == 0) r.clear_src();
          r.set_wait(rng_() % 2);
          v1::CopyBufferReply reply;
          EXPECT_USABLE(stub().CopyBuffer(&ctx, r, &reply));
          break;
        }
        default: {
          v1::BeginCaptureRequest r;
          r.set_session(s.id());
          for (int k = rng_() % 3; k > 0; --k) r.add_inputs(Handle(buffers));
          for (int k = rng_() % 3; k > 0; --k) RandomVariable(r.add_variables());
          v1::BeginCaptureReply reply;
          EXPECT_USABLE(stub().BeginCapture(&ctx, r, &reply));
          grpc::ClientContext ctx2;
          v1::EndCaptureRequest end;
          end.set_session(s.id());
          end.set_discard(rng_() % 2);
          for (int k = rng_() % 2; k > 0; --k) end.add_outputs(Handle(buffers));
          v1::GraphReply graph;
          grpc::Status st = stub().EndCapture(&ctx2, end, &graph);
          EXPECT_USABLE(st);
          if (st.ok() && graph.graph() != 0) graphs.push_back(graph.graph());
          break;
        }
      }
      if (HasFailure()) break;
    }
    EXPECT_TRUE(s.KeepAlive().ok()) << "the session survived";
  }
  // The mix reached past the first checks: some requests ran, others failed each way.
  EXPECT_GT(codes[grpc::StatusCode::OK], 100);
  EXPECT_GT(codes[grpc::StatusCode::INVALID_ARGUMENT], 100);
  EXPECT_GT(codes[grpc::StatusCode::NOT_FOUND], 100);
  for (auto [code, n] : codes) std::printf("status %d: %d\n", int(code), n);
  EXPECT_EQ(FreeMemory(), baseline);
  EXPECT_EQ(daemon_->engine().session_count(), 0u);
}

}  // namespace
}  // namespace replayd::client
