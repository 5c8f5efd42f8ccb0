// Redis Cluster key slots: which of the 16384 hash slots a key belongs to, as the cluster
// specification defines it: CRC16 (XMODEM: polynomial 0x1021, initial value 0, no reflection)
// of the key modulo 16384, where a key holding a non-empty "{...}" hashes only what is between
// the first '{' and the '}' after it (a hash tag, so related keys share a slot).
//
// kvpool's keys carry no hash tag: the blocks of one chain spread over every master, so a
// lookup's batch is served by all of them at once.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvpool::daemon::remote {

inline constexpr uint16_t kClusterSlots = 16384;

// CRC16/XMODEM of `data`.
uint16_t crc16(std::string_view data);

// The cluster slot of `key`.
uint16_t key_slot(std::string_view key);

}  // namespace kvpool::daemon::remote
