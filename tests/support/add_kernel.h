// The add(out, a, b, n) kernel the fake GPU drivers' tests load in every format, and what
// they check of it through a daemon: the signatures that differ from its parameters and
// the words Load refuses each with, a graph of one call of it with a variable dimension,
// and replays of such a graph refused past a limit.
#ifndef REPLAYD_TESTS_SUPPORT_ADD_KERNEL_H_
#define REPLAYD_TESTS_SUPPORT_ADD_KERNEL_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>

#include "client/client.h"
#include "tests/support/graph_def.h"

namespace replayd::testing {

// A signature other than add's "out,in,in,int32" (4 parameters of 8, 8, 8 and 4 bytes),
// and the end of the message Load refuses it with, after "<format> kernel add ".
struct WrongAddSignature {
  const char* signature;
  const char* message;
};
inline constexpr WrongAddSignature kWrongAddSignatures[] = {
    {"out,in,in", "takes more than 3 parameters; its signature declares 3 parameters (8, 8, 8 bytes)"},
    {"out,in,in,int32,int32",
     "takes 4 parameters (8, 8, 8, 4 bytes); its signature declares 5 parameters (8, 8, 8, 4, 4 bytes)"},
    {"out,in,in,int64", "takes 4 parameters (8, 8, 8, 4 bytes); its signature declares 4 parameters (8, 8, 8, 8 bytes)"},
    {"", "takes more than 0 parameters; its signature declares no parameters"},
};

// A graph's variable `name` in [min, max], a multiple of `multiple_of` when it is given.
inline v1::Variable VariableDef(const std::string& name, int64_t min, int64_t max, int64_t multiple_of = 0) {
  v1::Variable v;
  v.set_name(name);
  v.set_min(min);
  v.set_max(max);
  if (multiple_of) v.set_multiple_of(multiple_of);
  return v;
}

// A call's dimension: a constant, or the name of the graph's variable.
using DimDef = std::variant<int64_t, std::string>;

// The graph of one call of add, `program`, on parameters a, b and out of `n` floats (in
// that order in a replay), n a constant, its 1-D global and local each a constant or
// `variable`'s name.
inline v1::GraphDef OneAddCall(uint64_t program, int64_t n, const v1::Variable& variable, const DimDef& global,
                               const DimDef& local) {
  GraphDefBuilder builder;
  v1::GraphDef& def = builder.def();
  *def.add_variables() = variable;
  for (int i = 0; i < 3; ++i) builder.Slot(v1::Slot::PARAMETER, n * 4);
  v1::GraphCall* call = def.add_calls();
  call->set_program(program);
  for (uint32_t slot : {2u, 0u, 1u}) call->add_args()->mutable_view()->set_slot(slot);
  call->add_args()->mutable_expr()->set_constant(n);
  auto set = [](v1::Expr* e, const DimDef& d) {
    if (const int64_t* c = std::get_if<int64_t>(&d)) e->set_constant(*c);
    else e->set_variable(std::get<std::string>(d));
  };
  set(call->add_global(), global);
  set(call->add_local(), local);
  return def;
}

// Replays `graph` (a OneAddCall) on a, b and out with its variable at each of `values`:
// one above `most` is INVALID_ARGUMENT with `message` in its words, the others run.
inline void ExpectReplaysRefusedAbove(client::Session& session, client::Graph& graph, client::Buffer& a,
                                      client::Buffer& b, client::Buffer& out, std::initializer_list<int64_t> values,
                                      int64_t most, const std::string& message) {
  for (int64_t value : values) {
    absl::StatusOr<client::ReplayResult> replayed = session.Replay(graph, {&a, &b, &out, value}, /*wait=*/true);
    if (value > most) {
      EXPECT_EQ(replayed.status().code(), absl::StatusCode::kInvalidArgument) << value << ": " << replayed.status();
      EXPECT_THAT(std::string(replayed.status().message()), ::testing::HasSubstr(message)) << value;
    } else {
      EXPECT_TRUE(replayed.ok()) << value << ": " << replayed.status();
    }
  }
}

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_ADD_KERNEL_H_
