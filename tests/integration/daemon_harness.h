// Test harness: a real kvpoold process with its own config and socket in a temporary
// directory, and worker processes forked from the test.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>

namespace kvpool::testing {

// A scratch directory under /tmp, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// $KVPOOLD_BIN when set, else the kvpoold this build made (or "kvpoold" from $PATH).
std::string kvpoold_binary();

class Daemon {
 public:
  // Writes `config_yaml` (empty = run with the built-in default config) and starts kvpoold on
  // a socket in a fresh temporary directory. Extra command-line arguments may be given.
  explicit Daemon(const std::string& config_yaml, const std::string& extra_args = "");
  ~Daemon();  // SIGKILL if still running

  // Starts the process and waits (up to `timeout`) until it logs event=ready and its socket
  // accepts connections. Returns false, with the daemon's log in log(), if it exits or never
  // becomes ready (then it is still running: the destructor or kill9() ends it).
  bool start(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // A command the daemon runs under (e.g. "prlimit --nofile=1024:1024"), for the next start().
  void set_launcher(const std::string& launcher) { launcher_ = launcher; }
  // SIGTERM and wait (SIGKILL after 20 s); returns the exit status (as waitpid reports it) or -1.
  int stop();
  // SIGKILL and wait.
  void kill9();
  bool running();

  const std::string& socket() const { return socket_; }
  const std::string& config_path() const { return config_; }  // empty with the built-in config
  pid_t pid() const { return pid_; }
  // The pid of the last process start() began (kept after it ended), and how it ended: its exit
  // code, 128 + signal if killed, -1 while it runs or when nothing has reaped it yet.
  pid_t last_pid() const { return last_pid_; }
  int exit_status() const { return exit_status_; }
  std::string log() const;       // the daemon's stderr so far
  std::string log_path() const;  // the file it is written to (in the scratch directory)

 private:
  TempDir dir_;
  std::string socket_;
  std::string config_;
  std::string extra_;
  std::string launcher_;
  pid_t pid_ = -1;
  pid_t last_pid_ = -1;
  int exit_status_ = -1;
};

// A pipe for "ready" / "go on" handshakes between the test and its workers.
struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (::pipe(fd) != 0) std::abort();
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  // A side that only reads (or only writes) closes the other end, so that wait() sees the end of
  // the pipe (and returns false) once every writer is gone, instead of blocking forever.
  void close_read() {
    if (fd[0] >= 0) ::close(fd[0]);
    fd[0] = -1;
  }
  void close_write() {
    if (fd[1] >= 0) ::close(fd[1]);
    fd[1] = -1;
  }
  void signal() const { (void)!::write(fd[1], "x", 1); }
  bool wait() const {
    char ch = 0;
    return ::read(fd[0], &ch, 1) == 1;
  }
};

// Runs `fn` in a forked child process; returns its exit code (128 + signal if killed).
// The child exits with fn's return value; an uncaught exception or a failed EXPECT in the child
// does not reach the parent, so fn reports failure through its return value.
int run_worker(const std::function<int()>& fn);

// Forks a child that runs `fn` (which may block); returns its pid for the test to signal.
pid_t spawn_worker(const std::function<int()>& fn);
// Waits for a child; returns its exit code (128 + signal if killed).
int wait_worker(pid_t pid);

// Runs a command line through the shell; returns its exit code and fills `output` with its
// stdout and stderr.
int run_command(const std::string& command, std::string& output);

// Names in /dev/shm that start with "kvpool-<pid>-".
int shm_segments_of(pid_t pid);

}  // namespace kvpool::testing
