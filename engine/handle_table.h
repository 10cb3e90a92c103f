// Session-scoped handles. Each table hands out handles 1, 2, 3, ... and never reuses
// one, so a stale handle can never name a newer object.
//
// Thread safety: not thread-safe; the owning session serialises access.
#ifndef REPLAYD_ENGINE_HANDLE_TABLE_H_
#define REPLAYD_ENGINE_HANDLE_TABLE_H_

#include <cstdint>
#include <memory>
#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace replayd {

using Handle = uint64_t;

template <typename T>
class HandleTable {
 public:
  // `kind` names the objects in error messages ("buffer", "program").
  explicit HandleTable(absl::string_view kind) : kind_(kind) {}

  Handle Insert(std::shared_ptr<T> object) {
    Handle h = next_++;
    objects_.emplace(h, std::move(object));
    return h;
  }

  // The object behind `h`, or NOT_FOUND naming the handle.
  absl::StatusOr<std::shared_ptr<T>> Find(Handle h) const {
    auto it = objects_.find(h);
    if (it == objects_.end()) return NotFound(h);
    return it->second;
  }

  // Removes `h` and returns its object, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<T>> Remove(Handle h) {
    auto it = objects_.find(h);
    if (it == objects_.end()) return NotFound(h);
    std::shared_ptr<T> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

  void Clear() { objects_.clear(); }
  size_t size() const { return objects_.size(); }

 private:
  absl::Status NotFound(Handle h) const {
    return absl::NotFoundError(absl::StrCat(kind_, " ", h, " not found in this session"));
  }

  absl::string_view kind_;
  Handle next_ = 1;
  absl::flat_hash_map<Handle, std::shared_ptr<T>> objects_;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_HANDLE_TABLE_H_
