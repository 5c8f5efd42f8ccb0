// hello's hash scheme through a real kvpoold: a worker that names blocks with another algorithm,
// or with a faulty implementation of the daemon's scheme, is refused at attach with an error
// naming both schemes (instead of missing every block silently); the library's default and a
// worker that says nothing attach; a refused hello leaves no session behind.
#include <gtest/gtest.h>

#include <string>

#include "client/connection/connection.h"
#include "common/block_hash.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/hardening_util.h"

namespace kvpool::testing {
namespace {

using client::Connection;

TEST(HashScheme, AWorkerHashingOtherwiseIsRefusedNamingBothSchemes) {
  Daemon d(kHardeningPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto ours = Connection::attach(d.socket(), "sha256-worker", "", Connection::Memory::none);
  ASSERT_TRUE(ours.ok()) << ours.error().message;

  BlockHasher blake(HashAlgorithm::blake2s256);
  auto other = Connection::attach(d.socket(), "blake-worker", "", Connection::Memory::none, 0,
                                  blake.scheme());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().status.code(), Errc::invalid_argument);
  const std::string& m = other.error().message;
  EXPECT_NE(m.find("this worker hashes blocks with kvpool-blake2s256/1"), std::string::npos) << m;
  EXPECT_NE(m.find("the daemon's scheme is kvpool-sha256/1 (check "
                   "2177765eb5319c61ee270a6eb3074e5d"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("would never match"), std::string::npos) << m;

  // The right name with another check: an implementation that differs from the specification.
  HashScheme faulty = default_hash_scheme();
  faulty.check.hi ^= 1;
  auto wrong =
      Connection::attach(d.socket(), "faulty-worker", "", Connection::Memory::none, 0, faulty);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("differs from the specification"), std::string::npos)
      << wrong.error().message;

  // A worker that says nothing (a client of an older protocol's shape) is not checked.
  auto quiet =
      Connection::attach(d.socket(), "quiet-worker", "", Connection::Memory::none, 0, HashScheme{});
  ASSERT_TRUE(quiet.ok()) << quiet.error().message;
  auto sessions = ours.value()->sessions();
  ASSERT_TRUE(sessions.ok());
  EXPECT_EQ(sessions.value().size(), 2u);  // the refused ones left nothing
}

}  // namespace
}  // namespace kvpool::testing
