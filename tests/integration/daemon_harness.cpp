#include "tests/integration/daemon_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace kvpool::testing {

TempDir::TempDir() {
  std::string tmpl = "/tmp/kvpool-test-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Daemon::Daemon(const std::string& config_yaml, const std::string& extra_args)
    : socket_(dir_.file("kvpoold.sock")), extra_(extra_args) {
  if (!config_yaml.empty()) {
    config_ = dir_.file("kvpoold.yaml");
    std::ofstream(config_) << config_yaml;
  }
}

Daemon::~Daemon() {
  if (pid_ > 0) kill9();
}

namespace {

bool can_connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

std::string kvpoold_binary() {
  if (const char* e = std::getenv("KVPOOLD_BIN"); e != nullptr && *e != '\0') return e;
#ifdef KVPOOLD_BIN
  return KVPOOLD_BIN;
#else
  return "kvpoold";
#endif
}

bool Daemon::start(std::chrono::milliseconds timeout) {
  std::string cmd =
      (launcher_.empty() ? "" : launcher_ + " ") + kvpoold_binary() + " --socket " + socket_;
  if (!config_.empty()) cmd += " --config " + config_;
  if (!extra_.empty()) cmd += " " + extra_;
  const std::string log_path = dir_.file("kvpoold.log");
  const size_t log_start = log().size();  // the log is appended to across restarts
  exit_status_ = -1;
  pid_ = ::fork();
  last_pid_ = pid_;
  if (pid_ == 0) {
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(log, 2);
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!running()) return false;
    // Ready means the daemon said so: it listens on its socket before the last start-up steps
    // (stats segment, metrics endpoint), any of which may still stop it.
    if (log().find("event=ready", log_start) != std::string::npos && can_connect(socket_)) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool Daemon::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_status_ = exit_code(status);
    pid_ = -1;
    return false;
  }
  return true;
}

int Daemon::stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  // A daemon stuck on its way out (a hung device teardown) is killed after 20 s rather than
  // holding the test until its own timeout.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  exit_status_ = exit_code(status);
  return exit_status_;
}

void Daemon::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  exit_status_ = exit_code(status);
}

std::string Daemon::log_path() const {
  return dir_.file("kvpoold.log");
}

std::string Daemon::log() const {
  std::ifstream in(log_path());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

pid_t spawn_worker(const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = fn();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  return pid;
}

int wait_worker(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return exit_code(status);
}

int run_worker(const std::function<int()>& fn) {
  return wait_worker(spawn_worker(fn));
}

int run_command(const std::string& command, std::string& output) {
  output.clear();
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0)
    output.append(buf.data(), n);
  return exit_code(::pclose(p));
}

int shm_segments_of(pid_t pid) {
  const std::string prefix = "kvpool-" + std::to_string(pid) + "-";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

}  // namespace kvpool::testing
