#include "common/status.h"

namespace kvpool {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::ok:
      return "ok";
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::invalid_page:
      return "invalid_page";
    case Errc::invalid_owner:
      return "invalid_owner";
    case Errc::not_held:
      return "not_held";
    case Errc::out_of_pages:
      return "out_of_pages";
    case Errc::exceeds_capacity:
      return "exceeds_capacity";
    case Errc::already_published:
      return "already_published";
    case Errc::duplicate_item:
      return "duplicate_item";
    case Errc::refcount_overflow:
      return "refcount_overflow";
    case Errc::malformed_frame:
      return "malformed_frame";
    case Errc::unsupported_version:
      return "unsupported_version";
    case Errc::unknown_opcode:
      return "unknown_opcode";
    case Errc::frame_too_large:
      return "frame_too_large";
    case Errc::not_attached:
      return "not_attached";
    case Errc::already_attached:
      return "already_attached";
    case Errc::no_such_pool:
      return "no_such_pool";
    case Errc::quota_exceeded:
      return "quota_exceeded";
    case Errc::permission_denied:
      return "permission_denied";
    case Errc::too_many_sessions:
      return "too_many_sessions";
    case Errc::connection_lost:
      return "connection_lost";
    case Errc::internal:
      return "internal";
    case Errc::pin_limit_exceeded:
      return "pin_limit_exceeded";
    case Errc::pages_in_use:
      return "pages_in_use";
  }
  return "unknown_error";
}

std::string Status::message() const {
  std::string out(errc_name(code_));
  if (ok()) return out;
  const std::string v = std::to_string(value_);
  const std::string at = item_ == kNoItem ? "" : " (item " + std::to_string(item_) + ")";
  switch (code_) {
    case Errc::invalid_argument:
      out += ": invalid argument " + v + at;
      break;
    case Errc::invalid_page:
      out += ": page id " + v + at + " is outside the pool";
      break;
    case Errc::invalid_owner:
      out += ": owner " + v + " is not open";
      break;
    case Errc::not_held:
      out += ": page " + v + at + " is not held by this owner";
      break;
    case Errc::out_of_pages:
      out += ": " + v + " pages requested, not enough free or evictable pages";
      break;
    case Errc::exceeds_capacity:
      out += ": " + v + " pages requested, more than the pool has";
      break;
    case Errc::already_published:
      out += ": page " + v + at + " already carries a different hash";
      break;
    case Errc::duplicate_item:
      out += ": page " + v + at + " is listed twice";
      break;
    case Errc::refcount_overflow:
      out += ": page " + v + at + " has too many references";
      break;
    case Errc::frame_too_large:
      out += ": frame of " + v + " bytes exceeds the maximum";
      break;
    case Errc::unsupported_version:
      out += ": protocol version " + v + " is not supported";
      break;
    case Errc::unknown_opcode:
      out += ": opcode " + v + " is not known";
      break;
    case Errc::quota_exceeded:
      out += ": " + v + " pages would exceed the quota";
      break;
    case Errc::pin_limit_exceeded:
      out += ": " + v + " pinned pages would exceed the pin limit";
      break;
    case Errc::pages_in_use:
      // item carries the count here, not a batch position.
      out += ": " + std::to_string(item_) + " page" + (item_ == 1 ? "" : "s") +
             " past the new pool size " + (item_ == 1 ? "is" : "are") +
             " in use, the first is page " + v;
      break;
    case Errc::malformed_frame:
    case Errc::not_attached:
    case Errc::already_attached:
    case Errc::no_such_pool:
    case Errc::permission_denied:
    case Errc::too_many_sessions:
    case Errc::connection_lost:
    case Errc::internal:
    case Errc::ok:
      break;
  }
  return out;
}

}  // namespace kvpool
