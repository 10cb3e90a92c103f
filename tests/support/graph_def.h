// A v1::GraphDef built by its parts, for tests that define graphs explicitly.
#ifndef REPLAYD_TESTS_SUPPORT_GRAPH_DEF_H_
#define REPLAYD_TESTS_SUPPORT_GRAPH_DEF_H_

#include <cstdint>

#include "replayd/v1/replayd.pb.h"

namespace replayd::testing {

class GraphDefBuilder {
 public:
  // Adds a slot; returns its index. `buffer` names a constant's buffer.
  uint32_t Slot(v1::Slot::Kind kind, uint64_t bytes, uint64_t buffer = 0) {
    v1::Slot* s = def_.add_slots();
    s->set_kind(kind);
    s->set_bytes(bytes);
    if (buffer) s->set_buffer(buffer);
    return static_cast<uint32_t>(def_.slots_size() - 1);
  }
  // Adds a copy of `bytes` from the start of slot `src` to slot `dst` at `dst_offset`.
  void Copy(uint32_t dst, uint64_t dst_offset, uint32_t src, uint64_t bytes) {
    v1::GraphCopy* c = def_.add_calls()->mutable_copy();
    c->mutable_dst()->set_slot(dst);
    c->mutable_dst()->set_offset(dst_offset);
    c->mutable_dst()->set_length(bytes);
    c->mutable_src()->set_slot(src);
    c->mutable_src()->set_length(bytes);
  }
  v1::GraphDef& def() { return def_; }

 private:
  v1::GraphDef def_;
};

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_GRAPH_DEF_H_
