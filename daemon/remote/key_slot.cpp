#include "daemon/remote/key_slot.h"

#include <array>

namespace kvpool::daemon::remote {

namespace {

// The byte-at-a-time table of CRC16/XMODEM, built at compile time from the polynomial.
constexpr std::array<uint16_t, 256> make_table() {
  std::array<uint16_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i << 8;
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc & 0x8000u) != 0 ? (crc << 1) ^ 0x1021u : crc << 1;
    t[i] = static_cast<uint16_t>(crc);
  }
  return t;
}
constexpr std::array<uint16_t, 256> kTable = make_table();

}  // namespace

uint16_t crc16(std::string_view data) {
  uint16_t crc = 0;
  for (const char c : data) {
    const auto byte = static_cast<uint8_t>(c);
    crc = static_cast<uint16_t>((crc << 8) ^ kTable[((crc >> 8) ^ byte) & 0xFFu]);
  }
  return crc;
}

uint16_t key_slot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return static_cast<uint16_t>(crc16(key) % kClusterSlots);
}

}  // namespace kvpool::daemon::remote
