// Assertions on Status values for the pool core's tests: a failure prints the code's message,
// the item and the value, so a wrong Status names what differs.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/status.h"

namespace kvpool::testing {

inline std::string describe(const Status& s) {
  return s.message() + " [item " + std::to_string(s.item()) + ", value " +
         std::to_string(s.value()) + "]";
}

inline ::testing::AssertionResult is(const Status& got, const Status& want) {
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << describe(got) << ", want " << describe(want);
}

inline ::testing::AssertionResult ok(const Status& got) {
  return is(got, Status{});
}

}  // namespace kvpool::testing
