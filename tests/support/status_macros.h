// Test macros for StatusOr results that never dereference a failure: a failed call is
// reported and the test returns, so one broken case cannot end the binary (an abort on a
// failed StatusOr once hid half of the device suite) and every later case still runs.
#ifndef REPLAYD_TESTS_SUPPORT_STATUS_MACROS_H_
#define REPLAYD_TESTS_SUPPORT_STATUS_MACROS_H_

#include <gtest/gtest.h>

#include <utility>

#include "absl/status/status.h"

#define REPLAYD_STATUS_MACROS_CONCAT_INNER(a, b) a##b
#define REPLAYD_STATUS_MACROS_CONCAT(a, b) REPLAYD_STATUS_MACROS_CONCAT_INNER(a, b)

// ASSERT_OK_AND_ASSIGN(Program p, session.Load(spec)): declares (or assigns) `lhs` from the
// value of `rexpr`, a StatusOr; when it failed, a fatal failure naming `rexpr` and its
// status, and the test function returns.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  REPLAYD_ASSERT_OK_AND_ASSIGN_IMPL(REPLAYD_STATUS_MACROS_CONCAT(status_or_, __LINE__), lhs, rexpr)

#define REPLAYD_ASSERT_OK_AND_ASSIGN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                      \
  ASSERT_TRUE(statusor.ok()) << #rexpr << ": " << statusor.status(); \
  lhs = std::move(*statusor)

// ASSERT_OK(expr) / EXPECT_OK(expr): `expr`, an absl::Status evaluated once, is OK; else a
// failure naming the expression and the status.
#define ASSERT_OK(expr) REPLAYD_CHECK_OK_IMPL(REPLAYD_STATUS_MACROS_CONCAT(status_, __LINE__), expr, ASSERT_TRUE)
#define EXPECT_OK(expr) REPLAYD_CHECK_OK_IMPL(REPLAYD_STATUS_MACROS_CONCAT(status_, __LINE__), expr, EXPECT_TRUE)

#define REPLAYD_CHECK_OK_IMPL(status, expr, check) \
  switch (0)                                       \
  case 0:                                          \
  default:                                         \
    if (const absl::Status status = (expr); status.ok()) { \
    } else                                         \
      check(status.ok()) << #expr << ": " << status

#endif  // REPLAYD_TESTS_SUPPORT_STATUS_MACROS_H_
