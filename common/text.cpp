// The UTF-8 decoder and the two escapings of common/text.h.
#include "common/text.h"

#include <cstdio>

namespace kvpool {

namespace {

// Appends `format` applied to `value` (an escape of at most 6 characters).
void append_formatted(std::string& out, const char* format, unsigned value) {
  char buf[8];
  const int n = std::snprintf(buf, sizeof buf, format, value);
  out.append(buf, static_cast<size_t>(n));
}

// The loop both escapings share: walks `text` one character (or one invalid byte) at a time and
// lets `escape` append an escape for it; a character it leaves alone is copied as it was.
template <typename Escape>
std::string rewrite(std::string_view text, Escape escape) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const Utf8Char c = decode_utf8(text);
    const std::string_view bytes = text.substr(0, c.length);
    if (!escape(out, c, static_cast<unsigned char>(bytes.front()))) out += bytes;
    text.remove_prefix(c.length);
  }
  return out;
}

}  // namespace

Utf8Char decode_utf8(std::string_view text) {
  if (text.empty()) return {0, 0, false};
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {lead, 1, true};
  // The length from the lead byte, and the range the second byte must lie in: narrower than
  // 80..BF after E0 and F0 (overlong forms), ED (surrogates) and F4 (above U+10FFFF).
  size_t length = 0;
  char32_t code_point = 0;
  unsigned char second_low = 0x80;
  unsigned char second_high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    code_point = lead & 0x1fu;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    code_point = lead & 0x0fu;
    if (lead == 0xe0) second_low = 0xa0;
    if (lead == 0xed) second_high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    code_point = lead & 0x07u;
    if (lead == 0xf0) second_low = 0x90;
    if (lead == 0xf4) second_high = 0x8f;
  } else {
    return {};  // a continuation byte, C0, C1 (overlong two-byte forms) or F5..FF
  }
  if (text.size() < length) return {};
  for (size_t i = 1; i < length; ++i) {
    const unsigned char b = byte(i);
    const unsigned char low = i == 1 ? second_low : 0x80;
    const unsigned char high = i == 1 ? second_high : 0xbf;
    if (b < low || b > high) return {};
    code_point = (code_point << 6) | (b & 0x3fu);
  }
  return {code_point, length, true};
}

bool is_control_or_format(char32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

std::string display_text(std::string_view text) {
  return rewrite(text, [](std::string& out, const Utf8Char& c, unsigned char first_byte) {
    if (!c.valid) {
      append_formatted(out, "\\x%02x", first_byte);
      return true;
    }
    switch (c.code_point) {
      case '\\':
        out += "\\\\";
        return true;
      case '\t':
        out += "\\t";
        return true;
      case '\n':
        out += "\\n";
        return true;
      case '\r':
        out += "\\r";
        return true;
      default:
        break;
    }
    if (!is_control_or_format(c.code_point)) return false;
    append_formatted(out, c.code_point <= 0x7f ? "\\x%02x" : "\\u%04x", c.code_point);
    return true;
  });
}

std::string json_escape(std::string_view text) {
  return rewrite(text, [](std::string& out, const Utf8Char& c, unsigned char) {
    if (!c.valid) {
      out += "\\ufffd";
    } else if (c.code_point == '"' || c.code_point == '\\') {
      out += '\\';
      out += static_cast<char>(c.code_point);
    } else if (is_control_or_format(c.code_point)) {
      append_formatted(out, "\\u%04x", c.code_point);
    } else {
      return false;
    }
    return true;
  });
}

}  // namespace kvpool
