// The expression text parser and the interval bounds: any text either fails to parse or
// to bound with a status, or evaluates, at every corner of its variables' ranges and at
// values drawn from the input, to a value inside its bounds (no trap, no overflow: the
// evaluator is checked under UBSan).
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/expression.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using replayd::Expression;
using replayd::Interval;
using replayd::VariableDecl;

constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
const std::vector<VariableDecl> kVariables = {
    {"pos", 1, 256, 1}, {"n", -64, 64, 8}, {"big", kMin, kMax, 1}, {"neg", kMin, -1, 1}, {"w", -5, -1, 1}};

// A value of `v` from `raw`: in range and a multiple.
int64_t ValueOf(const VariableDecl& v, uint64_t raw) {
  const uint64_t span = static_cast<uint64_t>(v.max) - static_cast<uint64_t>(v.min);
  uint64_t offset = span == std::numeric_limits<uint64_t>::max() ? raw : raw % (span + 1);
  int64_t x = static_cast<int64_t>(static_cast<uint64_t>(v.min) + offset);
  int64_t r = ((x % v.multiple_of) + v.multiple_of) % v.multiple_of;
  return r == 0 ? x : (x - r >= v.min ? x - r : x + (v.multiple_of - r));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first 8 bytes pick values, the rest is the text.
  uint64_t seed = 0;
  const size_t head = size < 8 ? size : 8;
  std::memcpy(&seed, data, head);
  const std::string text(reinterpret_cast<const char*>(data) + head, size - head);
  absl::StatusOr<Expression> e = Expression::Parse(text, kVariables);
  if (!e.ok()) return 0;
  // ToString parenthesises every operation, so its text of a deep expression may pass the
  // parser's depth limit; text that parses is the same expression.
  absl::StatusOr<Expression> reparsed = Expression::Parse(e->ToString(kVariables), kVariables);
  FUZZ_CHECK(!reparsed.ok() || *reparsed == *e);
  absl::StatusOr<Interval> bounds = e->Bounds(kVariables);
  if (!bounds.ok()) return 0;
  std::vector<int64_t> values(kVariables.size());
  for (int round = 0; round < 8; ++round) {
    for (size_t i = 0; i < kVariables.size(); ++i) {
      const VariableDecl& v = kVariables[i];
      const uint64_t bit = (round >> (i % 3)) & 1;
      values[i] = round < 4 ? ValueOf(v, bit ? ~uint64_t{0} : 0) : ValueOf(v, seed * (round + 1) + i * 0x9e3779b97f4a7c15ull);
    }
    const int64_t got = e->Evaluate(values);
    FUZZ_CHECK(got >= bounds->min && got <= bounds->max);
  }
  return 0;
}
