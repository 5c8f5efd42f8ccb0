#include "daemon/core/ledger.h"

#include <algorithm>
#include <bit>

#include "daemon/core/check.h"

namespace kvpool::core {

namespace {
constexpr uint32_t kInitialSlots = 16;
}

Ledger::Ledger()
    : slots_(kInitialSlots),
      mask_(kInitialSlots - 1),
      shift_(64 - static_cast<uint32_t>(std::countr_zero(kInitialSlots))) {}

uint32_t Ledger::probe(PageId page) const {
  uint32_t i = home(page);
  while (slots_[i].page != kNoPage && slots_[i].page != page)
    i = (i + 1) & mask_;
  return i;
}

Ledger::Entry* Ledger::find(PageId page) {
  if (page == kNoPage) return nullptr;  // the empty-slot marker is never a key
  Entry& e = slots_[probe(page)];
  return e.page == page ? &e : nullptr;
}

const Ledger::Entry* Ledger::find(PageId page) const {
  if (page == kNoPage) return nullptr;
  const Entry& e = slots_[probe(page)];
  return e.page == page ? &e : nullptr;
}

void Ledger::grow() {
  std::vector<Entry> old = std::move(slots_);
  const auto n = static_cast<uint32_t>(old.size() * 2);
  slots_.assign(n, Entry{});
  mask_ = n - 1;
  shift_ = 64 - static_cast<uint32_t>(std::countr_zero(n));
  for (const Entry& e : old) {
    if (e.page != kNoPage) slots_[probe(e.page)] = e;
  }
}

void Ledger::add(PageId page, uint32_t n) {
  KVPOOL_DCHECK(page != kNoPage && n > 0);
  uint32_t i = probe(page);
  if (slots_[i].page == page) {
    slots_[i].count += n;
    references_ += n;
    return;
  }
  restore(page, n, next_stamp_++);
}

void Ledger::restore(PageId page, uint32_t count, uint64_t stamp) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint32_t i = probe(page);
  KVPOOL_DCHECK(slots_[i].page == kNoPage);
  slots_[i] = Entry{page, count, stamp};
  ++size_;
  references_ += count;
}

void Ledger::erase_at(uint32_t slot) {
  // Backward-shift deletion: pull later members of the probe run into the hole unless their home
  // lies cyclically in (hole, j], where moving them would put them before their home.
  uint32_t hole = slot;
  for (uint32_t j = (hole + 1) & mask_; slots_[j].page != kNoPage; j = (j + 1) & mask_) {
    const uint32_t h = home(slots_[j].page);
    if (((j - h) & mask_) >= ((j - hole) & mask_)) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Entry{};
  --size_;
}

void Ledger::erase(PageId page) {
  const uint32_t i = probe(page);
  KVPOOL_CHECK(slots_[i].page == page);
  references_ -= slots_[i].count;
  erase_at(i);
}

uint32_t Ledger::remove_one(Entry* e) {
  KVPOOL_DCHECK(e != nullptr && e->count > 0);
  --references_;
  if (--e->count != 0) return e->count;
  erase_at(static_cast<uint32_t>(e - slots_.data()));
  return 0;
}

std::vector<Ledger::Entry> Ledger::entries_newest_first() const {
  std::vector<Entry> out;
  out.reserve(size_);
  for_each([&](const Entry& e) { out.push_back(e); });
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.stamp > b.stamp; });
  return out;
}

}  // namespace kvpool::core
