/* A native backtrace on SIGSEGV/SIGBUS, for crashes gdb is not there to catch (the H200
 * machine has none) and Python's faulthandler cannot see (it is uninstalled by Python's
 * finalisation, so a crash at exit prints nothing). Found the exit-time cudnnDestroy crash
 * (docs/context-parallel.md). Build here, carry, preload there:
 *
 *   gcc -O1 -shared -fPIC bindings/python/bench/native_backtrace.c -o native_backtrace.so
 *   LD_PRELOAD=$PWD/native_backtrace.so python -m pytest ...
 *
 * Frames print as library(+offset); map an offset of our module to a function with
 * `nm -C _native.abi3.so | sort` on the same build (the release build keeps its symbols).
 * faulthandler, when pytest enables it, saves this handler and puts it back when disabled. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
static void handler(int sig, siginfo_t* si, void* ctx) {
  (void)si; (void)ctx;
  void* buf[96];
  int n = backtrace(buf, 96);
  const char msg[] = "\n*** fatal signal: native backtrace (native_backtrace.so) ***\n";
  write(2, msg, sizeof msg - 1);
  backtrace_symbols_fd(buf, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void native_backtrace_init(void) {
  void* warm[2];
  backtrace(warm, 2); /* loads libgcc_s now, not inside the handler */
  static char stack[1 << 16];
  stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
  sigaltstack(&ss, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
}
