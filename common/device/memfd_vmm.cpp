#include "common/device/memfd_vmm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/byte_units.h"
#include "common/system_memory.h"

namespace kvpool::device {

namespace {

wire::Error failed(const std::string& what, int err) {
  return wire::Error{Status(Errc::internal), what + ": " + std::strerror(err)};
}

int as_fd(VmmHandle h) {
  return static_cast<int>(h);
}

}  // namespace

uint64_t MemfdVmm::system_page_size() {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uint64_t>(page) : 4096;
}

MemfdVmm::MemfdVmm(uint64_t granularity) : granularity_(granularity) {}

std::string MemfdVmm::why_no_room(uint64_t bytes) const {
  const auto avail = mem_available_bytes();
  if (!avail || bytes <= *avail) return {};
  return "cannot reserve " + human_bytes(bytes) + " (" + std::to_string(bytes) +
         " bytes) of memfd memory: only " + human_bytes(*avail) +
         " of memory is available (MemAvailable, /proc/meminfo)";
}

wire::Result<VmmHandle> MemfdVmm::create(uint64_t bytes) {
  if (std::string why = why_no_room(bytes); !why.empty()) {
    return wire::Error{Status(Errc::invalid_argument), std::move(why)};
  }
  const int fd = ::memfd_create("kvpool-segment", MFD_CLOEXEC);
  if (fd < 0) return failed("memfd_create", errno);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    return failed("ftruncate of a memfd to " + std::to_string(bytes) + " bytes", e);
  }
  if (const int e = reserve_file(fd, bytes); e != 0) {
    ::close(fd);
    return failed("cannot reserve " + human_bytes(bytes) + " (" + std::to_string(bytes) +
                      " bytes) of memfd memory: fallocate",
                  e);
  }
  return VmmHandle(static_cast<uint64_t>(fd));
}

wire::Result<int> MemfdVmm::export_fd(VmmHandle handle) {
  const int fd = ::fcntl(as_fd(handle), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return failed("export (dup) of a segment descriptor", errno);
  return fd;
}

wire::Result<VmmHandle> MemfdVmm::import_fd(int fd, uint64_t bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return failed("fstat of a received segment descriptor", errno);
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return wire::Error{Status(Errc::invalid_argument),
                       "a received segment descriptor holds " + std::to_string(st.st_size) +
                           " bytes, the pool says " + std::to_string(bytes)};
  }
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return failed("import (dup) of a segment descriptor", errno);
  return VmmHandle(static_cast<uint64_t>(own));
}

void MemfdVmm::release(VmmHandle handle) {
  ::close(as_fd(handle));
}

void MemfdVmm::discard(VmmHandle handle, uint64_t bytes) {
  // Frees the pages and zaps every process's mapping of them: a worker that still maps a segment
  // the pool gave back (it has not made a call since) no longer keeps its memory. Best effort:
  // without it the memory goes with the last mapping.
  (void)::fallocate(as_fd(handle), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                    static_cast<off_t>(bytes));
}

wire::Result<uintptr_t> MemfdVmm::reserve(uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return failed("reserving " + std::to_string(bytes) + " bytes", errno);
  return reinterpret_cast<uintptr_t>(p);
}

wire::Result<bool> MemfdVmm::map(uintptr_t va, uint64_t bytes, VmmHandle handle) {
  void* p = ::mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED,
                   as_fd(handle), 0);
  if (p == MAP_FAILED) return failed("mapping a " + std::to_string(bytes) + "-byte segment", errno);
  return true;
}

wire::Result<bool> MemfdVmm::set_access(uintptr_t va, uint64_t bytes) {
  if (::mprotect(reinterpret_cast<void*>(va), bytes, PROT_READ | PROT_WRITE) != 0) {
    return failed("setting read-write access on " + std::to_string(bytes) + " bytes", errno);
  }
  return true;
}

void MemfdVmm::unmap(uintptr_t va, uint64_t bytes) {
  // Replaces the segment's mapping with an inaccessible one: the range stays reserved.
  (void)::mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

void MemfdVmm::unreserve(uintptr_t va, uint64_t bytes) {
  ::munmap(reinterpret_cast<void*>(va), bytes);
}

}  // namespace kvpool::device
