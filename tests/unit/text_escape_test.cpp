// Untrusted text made safe to print (common/text.h): the strict UTF-8 decoder, display_text for
// terminals and kvpoold's log, json_escape for JSON strings (checked by nlohmann::json, which
// throws on invalid UTF-8), and the log line kvpoold writes for a hostile worker name.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/text.h"
#include "daemon/telemetry/log.h"

namespace kvpool {
namespace {

using namespace std::string_literals;

// The UTF-8 form of a code point, written independently of decode_utf8.
std::string encode(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// The string a JSON string literal with content `escaped` stands for (throws if it is not valid
// JSON or not valid UTF-8).
std::string json_string(const std::string& escaped) {
  return nlohmann::json::parse("\"" + escaped + "\"").get<std::string>();
}

// `text` is valid UTF-8; with `printable`, every character also shows as a glyph (nothing a
// terminal acts on).
bool utf8(std::string_view text, bool printable) {
  while (!text.empty()) {
    const Utf8Char c = decode_utf8(text);
    if (!c.valid || (printable && is_control_or_format(c.code_point))) return false;
    text.remove_prefix(c.length);
  }
  return true;
}

TEST(TextEscapeDecoder, DecodesEveryScalarValueAndRefusesSurrogates) {
  for (uint32_t cp = 0; cp <= 0x10ffff; ++cp) {
    const std::string bytes = encode(cp);
    const Utf8Char c = decode_utf8(bytes);
    if (cp >= 0xd800 && cp <= 0xdfff) {
      ASSERT_FALSE(c.valid) << std::hex << cp;
      ASSERT_EQ(c.length, 1u) << std::hex << cp;
    } else {
      ASSERT_TRUE(c.valid) << std::hex << cp;
      ASSERT_EQ(static_cast<uint32_t>(c.code_point), cp);
      ASSERT_EQ(c.length, bytes.size()) << std::hex << cp;
    }
  }
}

TEST(TextEscapeDecoder, RefusesOverlongTruncatedAndOutOfRangeSequences) {
  for (const std::string& bad :
       {"\x80"s, "\xbf"s, "\xc0\xaf"s, "\xc1\xbf"s, "\xe0\x80\xaf"s, "\xe0\x9f\xbf"s,
        "\xf0\x80\x80\xaf"s, "\xf0\x8f\xbf\xbf"s, "\xed\xa0\x80"s, "\xed\xbf\xbf"s,
        "\xf4\x90\x80\x80"s, "\xf5"s, "\xff"s, "\xfe"s, "\xc3"s, "\xe4\xb8"s, "\xf0\x9f\x98"s,
        "\xc3("s, "\xe4\xb8("s}) {
    const Utf8Char c = decode_utf8(bad);
    EXPECT_FALSE(c.valid) << display_text(bad);
    EXPECT_EQ(c.length, 1u) << display_text(bad);
  }
  EXPECT_EQ(decode_utf8("").length, 0u);
  EXPECT_EQ(decode_utf8("ab").length, 1u);  // only the first character
}

TEST(TextEscapeDisplay, PrintableUtf8PassesUnchanged) {
  for (const std::string& ok : {"worker-7"s, "caf\xc3\xa9"s, "\xe4\xb8\xad\xe6\x96\x87"s,
                                "\xf0\x9f\x98\x80 emoji"s, "a b \"q\" = 'x'"s, ""s}) {
    EXPECT_EQ(display_text(ok), ok);
  }
}

TEST(TextEscapeDisplay, ControlsAndInvalidBytesBecomeVisibleEscapes) {
  EXPECT_EQ(display_text("\x1b[2J"), "\\x1b[2J");
  EXPECT_EQ(display_text("a\rb\nc\td"), "a\\rb\\nc\\td");
  EXPECT_EQ(display_text("\x00\x07\x7f"s), "\\x00\\x07\\x7f");
  EXPECT_EQ(display_text("back\\slash"), "back\\\\slash");
  EXPECT_EQ(display_text("\xc2\x85\xc2\x9b"), "\\u0085\\u009b");  // C1: NEL, CSI
  EXPECT_EQ(display_text("\xe2\x80\xae"
                         "abc"),
            "\\u202eabc");                             // right-to-left override
  EXPECT_EQ(display_text("\xe2\x80\xa8"), "\\u2028");  // line separator
  EXPECT_EQ(display_text("\xff"), "\\xff");
  EXPECT_EQ(display_text("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(display_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
  EXPECT_EQ(display_text("ab\xe4\xb8"), "ab\\xe4\\xb8");       // truncated at the end
  EXPECT_EQ(display_text("\xf0\x9f\x98"), "\\xf0\\x9f\\x98");
  EXPECT_EQ(display_text("caf\xc3\xa9\x1b\xff"), "caf\xc3\xa9\\x1b\\xff");  // valid text stays
  // A literal backslash-x in a name cannot pass for an escaped byte.
  EXPECT_NE(display_text("\\x1b"), display_text("\x1b"));
}

TEST(TextEscapeJson, ValidTextRoundTripsThroughAStrictParser) {
  for (const std::string& s :
       {"worker-7"s, "\"quoted\" and \\back\\"s, "\x1b[2J\r\n\t\b\f"s, "nul \x00 del \x7f"s,
        "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"s, "\xc2\x85\xe2\x80\xae\xe2\x80\xa8"s, ""s}) {
    const std::string escaped = json_escape(s);
    EXPECT_EQ(json_string(escaped), s) << escaped;
    for (const char c : escaped) {
      EXPECT_GE(static_cast<unsigned char>(c), 0x20u) << escaped;  // no raw control byte
      EXPECT_NE(c, '\x7f') << escaped;
    }
  }
  EXPECT_EQ(json_escape("\x1b"), "\\u001b");  // was silently dropped
  EXPECT_EQ(json_escape("caf\xc3\xa9"), "caf\xc3\xa9");
}

TEST(TextEscapeJson, InvalidBytesBecomeReplacementCharacters) {
  const std::string fffd = "\xef\xbf\xbd";
  // nlohmann::json is strict: raw invalid UTF-8 cannot be dumped, so it catches what it must.
  EXPECT_THROW((void)nlohmann::json("\xff").dump(), nlohmann::json::type_error);
  EXPECT_EQ(json_escape("\xff"), "\\ufffd");
  EXPECT_EQ(json_string(json_escape("a\xff"
                                    "b")),
            "a" + fffd + "b");
  EXPECT_EQ(json_string(json_escape("\xc0\xaf")), fffd + fffd);
  EXPECT_EQ(json_string(json_escape("\xed\xa0\x80")), fffd + fffd + fffd);
  EXPECT_EQ(json_string(json_escape("ok\xe4\xb8")), "ok" + fffd + fffd);
  const std::string worker =
      "\x1b[2J\r\xff"
      "caf\xc3\xa9";
  const nlohmann::json j = nlohmann::json::parse("{\"worker\":\"" + json_escape(worker) + "\"}");
  EXPECT_EQ(j["worker"], "\x1b[2J\r" + fffd + "caf\xc3\xa9");
  EXPECT_NO_THROW((void)j.dump());
}

// Whatever the bytes: display_text gives printable UTF-8 without raw ESC/CR, json_escape gives
// JSON a strict parser accepts, and valid UTF-8 input comes back from the JSON unchanged.
TEST(TextEscapeFuzz, ArbitraryBytesAlwaysGiveSafeOutput) {
  std::mt19937 rng(20240611);
  const std::string alphabet =
      "a\\\"\x1b\r\n\x7f\x80\xbf\xc0\xc2\xc3\xa9\xe2\x80\xae\xed\xa0\xf0"
      "\x9f\x98\xf4\x90\xff"s;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s(rng() % 24, '\0');
    for (char& c : s)
      c = iter % 2 == 0 ? alphabet[rng() % alphabet.size()] : static_cast<char>(rng());
    const std::string shown = display_text(s);
    ASSERT_TRUE(utf8(shown, true)) << shown;
    std::string parsed;
    ASSERT_NO_THROW(parsed = json_string(json_escape(s))) << shown;
    ASSERT_NO_THROW((void)nlohmann::json(parsed).dump()) << shown;
    if (utf8(s, false)) {
      ASSERT_EQ(parsed, s) << shown;
    }
  }
}

TEST(TextEscapeLog, DaemonLogValuesCarryNoRawControlsOrInvalidBytes) {
  daemon::set_log_level(daemon::LogLevel::info);
  ::testing::internal::CaptureStderr();
  daemon::log_event(daemon::LogLevel::info, "session_attach",
                    {daemon::kv("session", 7),
                     daemon::kv("worker",
                                "\x1b[2J\r\xff"
                                "caf\xc3\xa9"),
                     daemon::kv("quoted", "say \"hi\""), daemon::kv("path", "a\\b")});
  const std::string line = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(line,
            "level=info event=session_attach session=7 worker=\\x1b[2J\\r\\xffcaf\xc3\xa9 "
            "quoted=\"say \\\"hi\\\"\" path=a\\\\b\n");
  EXPECT_TRUE(utf8(line.substr(0, line.size() - 1), true));
}

}  // namespace
}  // namespace kvpool
