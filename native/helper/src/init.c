/*
 * warren-init: the pid 1 of every container sandbox. It only reaps: orphans
 * are re-parented to it and must not pile up as zombies. Everything else
 * (signals, exec of user processes) happens from outside. It runs in hundreds
 * of sandboxes at once, so it stays tiny: no stdio, no allocation, blocked
 * signals consumed with sigwaitinfo.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
  /* stray fds: keep 0..2 (the spawner points them at /dev/null) */
  if (syscall(SYS_close_range, 3, ~0U, 0) < 0) {
    for (int fd = 3; fd < 1024; fd++) close(fd);
  }
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  /* exec'd through an fd, comm would be the fd number */
  prctl(PR_SET_NAME, (unsigned long)"warren-init", 0, 0, 0);

  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, NULL);

  for (;;) {
    int status;
    pid_t pid;
    do pid = waitpid(-1, &status, WNOHANG | __WALL);
    while (pid > 0 || (pid < 0 && errno == EINTR));
    /* ECHILD or 0: nothing to reap now. Any signal (SIGCHLD included) wakes us; others are dropped. */
    siginfo_t info;
    while (sigwaitinfo(&all, &info) < 0 && errno == EINTR) {
    }
  }
}
