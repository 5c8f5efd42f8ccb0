// Error codes and the Status value that every kvpool call returns.
//
// A Status is trivially copyable and costs nothing on the success path: it carries a code and
// two numbers (the position of the offending item in a batch, and a value such as a page id);
// the human-readable message is built only when someone asks for it. The same codes travel on the
// wire, so their numeric values are stable: append new ones, never renumber.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvpool {

enum class Errc : uint16_t {
  ok = 0,
  invalid_argument = 1,   // a count, size or span that can never be valid
  invalid_page = 2,       // a page id outside the pool
  invalid_owner = 3,      // an owner (session) id that is not open
  not_held = 4,           // the owner holds no (more) references to that page
  out_of_pages = 5,       // not enough free or evictable pages right now
  exceeds_capacity = 6,   // more pages than the whole pool has: can never succeed
  already_published = 7,  // the page already carries a different hash
  duplicate_item = 8,     // the same page listed twice where that is not allowed
  refcount_overflow = 9,  // a page's reference count would overflow
  // Protocol and service errors.
  malformed_frame = 20,      // bytes that do not decode as the message they claim to be
  unsupported_version = 21,  // a frame of a protocol version this side does not speak
  unknown_opcode = 22,       // an opcode this side does not know
  frame_too_large = 23,      // a frame longer than the maximum frame size
  not_attached = 24,         // an operation before hello
  already_attached = 25,     // a second hello on one connection
  no_such_pool = 26,         // hello names a pool the daemon does not have
  quota_exceeded = 27,       // a session or tenant limit would be exceeded
  permission_denied = 28,    // the peer's credentials do not allow this
  too_many_sessions = 29,    // the daemon's session limit is reached
  connection_lost = 30,      // client side: the daemon closed the connection or is not there
  internal = 31,             // a daemon-side failure (e.g. a system call); the message says which
  pin_limit_exceeded = 32,   // the pins of a call would pass its tenant's pin limit
  // A pool shrink would remove pages that are in use: item = how many, value = the first one.
  pages_in_use = 33,
};

std::string_view errc_name(Errc code);

inline constexpr uint32_t kNoItem = UINT32_MAX;

class [[nodiscard]] Status {
 public:
  constexpr Status() = default;
  constexpr Status(Errc code, uint32_t item = kNoItem, uint64_t value = 0)
      : code_(code), item_(item), value_(value) {}

  static constexpr Status ok_status() { return Status(); }

  constexpr bool ok() const { return code_ == Errc::ok; }
  constexpr explicit operator bool() const { return ok(); }
  constexpr Errc code() const { return code_; }
  // Position of the offending item in the batch, or kNoItem.
  constexpr uint32_t item() const { return item_; }
  // The offending value: a page id, an owner id or a count, depending on the code.
  constexpr uint64_t value() const { return value_; }

  // "not_held: page 17 (item 3) is not held by this owner"
  std::string message() const;

  friend constexpr bool operator==(const Status&, const Status&) = default;

 private:
  Errc code_ = Errc::ok;
  uint32_t item_ = kNoItem;
  uint64_t value_ = 0;
};

}  // namespace kvpool
