// Internal to kvpool_common: the shared machinery of the wire codec (common/wire/protocol.cpp,
// common/wire/protocol_pool.cpp and common/wire/protocol_ops.cpp), not part of any public
// interface. It holds the wire sizes of the fixed-width fields, the error-text helpers (cat, Piece,
// Hex, make_error), Writer and Reader.
//
// Invariants the codec relies on:
//  - Writer writes into a buffer sized exactly by body_size (plus the frame header and, for a
//    reply, its status code); it checks nothing, so body_size and put_body must agree.
//  - Reader never reads past the span it was given: every read checks the bytes left first. The
//    first failed read records an Error (malformed_frame, naming the message, the field and the
//    numbers) and returns false, so that reads chain with &&; nothing is sized from a count
//    before count() has checked it against kMaxBatch and the bytes left.
#pragma once

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/wire/protocol.h"

namespace kvpool::wire::codec {

// Wire sizes of the fixed-width fields.
inline constexpr size_t kU8 = 1;
inline constexpr size_t kU16 = 2;
inline constexpr size_t kU32 = 4;
inline constexpr size_t kU64 = 8;
inline constexpr size_t kHashBytes = 2 * kU64;

// Error messages are built only on failure, with one allocation: cat() joins pieces of text and
// numbers that are formatted in place.
struct Hex {
  uint64_t value;
  int digits;
};

class Piece {
 public:
  Piece(std::string_view s) : text_(s) {}  // NOLINT(google-explicit-constructor)
  Piece(const char* s) : text_(s) {}       // NOLINT(google-explicit-constructor)
  template <std::integral T>
  Piece(T v) {  // NOLINT(google-explicit-constructor)
    const auto [end, ec] = std::to_chars(buf_, buf_ + sizeof buf_, v);
    len_ = static_cast<size_t>(end - buf_);
  }
  Piece(Hex h) {  // NOLINT(google-explicit-constructor)
    static constexpr char kDigits[] = "0123456789abcdef";
    len_ = static_cast<size_t>(h.digits) + 2;
    buf_[0] = '0';
    buf_[1] = 'x';
    for (size_t i = len_; i > 2; --i, h.value >>= 4)
      buf_[i - 1] = kDigits[h.value & 0xf];
  }
  std::string_view view() const { return len_ != 0 ? std::string_view(buf_, len_) : text_; }

 private:
  std::string_view text_;
  char buf_[24] = {};
  size_t len_ = 0;
};

inline std::string cat(std::initializer_list<Piece> pieces) {
  size_t n = 0;
  for (const Piece& p : pieces)
    n += p.view().size();
  std::string s;
  s.reserve(n);
  for (const Piece& p : pieces)
    s += p.view();
  return s;
}

inline Error make_error(Errc code, uint64_t value, std::string message, uint32_t item = kNoItem) {
  return Error{Status(code, item, value), std::move(message)};
}

// Encoding ------------------------------------------------------------------------------------

// Writes into a buffer that the caller has sized exactly (from body_size): no write is checked,
// so a body_size that is smaller than what put_body writes is a buffer overrun (put_frame asserts
// the end in debug builds).
class Writer {
 public:
  explicit Writer(std::byte* p) : p_(p) {}

  template <typename T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  void raw(const void* src, size_t n) {
    if (n != 0) std::memcpy(p_, src, n);
    p_ += n;
  }
  void str(std::string_view s) {
    put(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  template <typename T>
  void array(const std::vector<T>& v) {
    put(static_cast<uint32_t>(v.size()));
    raw(v.data(), v.size() * sizeof(T));
  }
  const std::byte* pos() const { return p_; }

 private:
  std::byte* p_;
};

// Decoding ------------------------------------------------------------------------------------

// A bounds-checked cursor over one payload. Every read checks the bytes left first; the first
// failure records an Error naming the message (`what`), the field and the numbers, and returns
// false so that decoders can chain reads with &&.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, std::string_view what)
      : p_(bytes.data()), left_(bytes.size()), size_(bytes.size()), what_(what) {}

  // `field` and `suffix` name what is read (the suffix saves building a string on success).
  template <typename T>
  bool get(T& v, std::string_view field, std::string_view suffix = {}) {
    static_assert(std::is_integral_v<T>);
    if (left_ < sizeof(T)) {
      return fail(left_, cat({what_, ": payload ends at byte ", size_ - left_, " in ", field,
                              suffix, " (needs ", sizeof(T), " bytes, ", left_, " left)"}));
    }
    std::memcpy(&v, p_, sizeof(T));
    skip(sizeof(T));
    return true;
  }

  // A batch count: at most kMaxBatch, and count × item_bytes bytes must follow. Nothing is sized
  // from `n` unless this returns true.
  bool count(uint32_t& n, size_t item_bytes, std::string_view field) {
    return get(n, field) && check_count(n, item_bytes, field);
  }
  // count() for an `n` already read (e.g. with a flag bit taken off).
  bool check_count(uint32_t n, size_t item_bytes, std::string_view field) {
    if (n > kMaxBatch) {
      return fail(n, cat({what_, ": ", field, " ", n, " is above kMaxBatch (", kMaxBatch, ")"}));
    }
    if (uint64_t{n} * item_bytes > left_) {
      return fail(n, cat({what_, ": ", field, " ", n, " but only ", left_, " bytes follow (needs ",
                          uint64_t{n} * item_bytes, ")"}));
    }
    return true;
  }

  // A u32 count of T followed by that many Ts whose memory layout is the wire layout.
  template <typename T>
  bool array(std::vector<T>& v, std::string_view field) {
    uint32_t n = 0;
    return count(n, sizeof(T), field) && items(v, n, field);
  }
  // `n` Ts (a count that check_count() accepted) whose memory layout is the wire layout.
  template <typename T>
  bool items(std::vector<T>& v, uint32_t n, std::string_view field) {
    v.resize(n);
    return raw(v.data(), size_t{n} * sizeof(T), field);
  }

  // A u32 length followed by that many bytes, at most `max_bytes` (named `limit`).
  bool str(std::string& s, std::string_view field, size_t max_bytes = kMaxNameBytes,
           std::string_view limit = "kMaxNameBytes") {
    uint32_t n = 0;
    if (!get(n, field, " length")) return false;
    if (n > max_bytes) {
      return fail(
          n, cat({what_, ": ", field, " is ", n, " bytes, above ", limit, " (", max_bytes, ")"}));
    }
    if (n > left_) {
      return fail(n,
                  cat({what_, ": ", field, " length ", n, " but only ", left_, " bytes follow"}));
    }
    s.assign(reinterpret_cast<const char*>(p_), n);
    skip(n);
    return true;
  }

  // The next `n` bytes, or nullptr (and an error) when fewer are left. For batches whose size
  // count() has validated, so that the items can then be read without a check each.
  // Bytes not read yet (an optional trailing field is present when there are).
  size_t left() const { return left_; }
  const std::byte* take(size_t n, std::string_view field) {
    if (n > left_) {  // unreachable after count(), kept so that no read is ever unchecked
      fail(n, cat({what_, ": ", field, " need ", n, " bytes, ", left_, " left"}));
      return nullptr;
    }
    const std::byte* p = p_;
    skip(n);
    return p;
  }

  // The whole payload was consumed.
  bool finish() {
    if (left_ == 0) return true;
    return fail(left_, cat({what_, ": ", left_, left_ == 1 ? " trailing byte" : " trailing bytes",
                            " after ", size_ - left_, " decoded bytes"}));
  }

  bool fail(uint64_t value, std::string message, uint32_t item = kNoItem) {
    error_ = make_error(Errc::malformed_frame, value, std::move(message), item);
    return false;
  }
  Error take_error() { return std::move(error_); }
  std::string_view what() const { return what_; }

 private:
  bool raw(void* dst, size_t n, std::string_view field) {
    const std::byte* p = take(n, field);
    if (p == nullptr) return false;
    if (n != 0) std::memcpy(dst, p, n);
    return true;
  }
  void skip(size_t n) {
    p_ += n;
    left_ -= n;
  }

  const std::byte* p_;
  size_t left_;
  size_t size_;
  std::string_view what_;
  Error error_;
};

}  // namespace kvpool::wire::codec
