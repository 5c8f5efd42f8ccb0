// Untrusted text made safe to print: worker names are chosen by clients (any bytes up to
// wire::kMaxNameBytes), and tenant names, pool names and error messages may quote them. Such
// text must never reach a terminal or a log raw (an ESC starts an escape sequence, a CR
// overwrites the line) and must never make JSON output invalid UTF-8.
//
// One strict UTF-8 decoder (decode_utf8) serves both renderings:
//   - display_text, for terminals and kvpoold's log: valid printable UTF-8 passes unchanged;
//     a backslash, control characters (C0, DEL, C1), the bidirectional and line-separator
//     formatting characters, and every byte that is not part of valid UTF-8 become visible
//     escapes (\\, \t, \n, \r, \x1b, \u0085, \u202e, \xff). The output is printable UTF-8 and
//     unambiguous: a backslash in it always starts an escape.
//   - json_escape, for the content of a JSON string: always valid JSON and valid UTF-8. '"' and
//     '\' are escaped, control and formatting characters become \u00XX / \uXXXX, bytes that are
//     not valid UTF-8 become \ufffd (the replacement character), the rest is kept.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvpool {

// The character at the front of some text. A byte that does not start a valid UTF-8 sequence
// (a stray continuation byte, C0/C1/F5..FF, an overlong form, a surrogate, a code point above
// U+10FFFF, a sequence cut short) is reported as invalid with length 1, so that a caller
// escapes it and resumes at the next byte.
struct Utf8Char {
  char32_t code_point = 0;  // meaningful only when valid
  size_t length = 1;        // bytes taken from the text: 1..4
  bool valid = false;
};

// Decodes the first character of `text`, which must not be empty (RFC 3629, Unicode table 3-7).
Utf8Char decode_utf8(std::string_view text);

// True for code points that change how a terminal shows the text instead of showing a glyph:
// C0 controls, DEL, C1 controls, the bidirectional marks, embeddings, overrides and isolates
// (U+200E, U+200F, U+202A..U+202E, U+2066..U+2069) and the line and paragraph separators
// (U+2028, U+2029).
bool is_control_or_format(char32_t code_point);

std::string display_text(std::string_view text);
std::string json_escape(std::string_view text);

}  // namespace kvpool
