/*
 * clone3 on a private stack (the glibc clone() wrapper has no clone3
 * counterpart). Used for CLONE_INTO_CGROUP: the child is born inside the
 * sandbox's cgroup2 group, so no cgroup migration (and no write side of the
 * global cgroup_threadgroup_rwsem, i.e. no RCU grace period) is needed.
 *
 * The child starts on `stack + stack_size`, calls fn(arg) and exits with its
 * return value; it never returns into the caller's frame.
 */
#include "wn.h"

#include <linux/sched.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>

#ifndef SYS_clone3
#define SYS_clone3 435
#endif

#if defined(__x86_64__)
static long clone3_raw(struct clone_args *args, size_t size, int (*fn)(void *), void *arg) {
  long ret;
  register void *r12 __asm__("r12") = (void *)fn;
  register void *r13 __asm__("r13") = arg;
  __asm__ volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      /* child: rsp is the top of the new stack (16-byte aligned) */
      "xor %%ebp, %%ebp\n\t"
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov $60, %%eax\n\t" /* SYS_exit */
      "syscall\n\t"
      "ud2\n"
      "1:\n\t"
      : "=a"(ret)
      : "0"((long)SYS_clone3), "D"(args), "S"(size), "r"(r12), "r"(r13)
      : "rcx", "r11", "memory");
  return ret;
}
#define HAVE_CLONE3_RAW 1
#elif defined(__aarch64__)
static long clone3_raw(struct clone_args *args, size_t size, int (*fn)(void *), void *arg) {
  register long x0 __asm__("x0") = (long)args;
  register long x1 __asm__("x1") = (long)size;
  register long x8 __asm__("x8") = SYS_clone3;
  register void *x19 __asm__("x19") = (void *)fn;
  register void *x20 __asm__("x20") = arg;
  __asm__ volatile(
      "svc #0\n\t"
      "cbnz x0, 1f\n\t"
      "mov x29, xzr\n\t"
      "mov x0, x20\n\t"
      "blr x19\n\t"
      "mov x8, #93\n\t" /* SYS_exit */
      "svc #0\n\t"
      "brk #0\n"
      "1:\n\t"
      : "+r"(x0)
      : "r"(x1), "r"(x8), "r"(x19), "r"(x20)
      : "x30", "memory");
  return x0;
}
#define HAVE_CLONE3_RAW 1
#endif

pid_t wn_clone3(int (*fn)(void *), void *arg, char *stack, size_t stack_size, uint64_t flags, int exit_signal,
                int cgroup_fd, int *pidfd, pid_t *parent_tid) {
#ifdef HAVE_CLONE3_RAW
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = flags;
  args.exit_signal = (uint64_t)exit_signal;
  args.stack = (uint64_t)(uintptr_t)stack;
  args.stack_size = stack_size & ~(size_t)15;
  if (flags & CLONE_PIDFD) args.pidfd = (uint64_t)(uintptr_t)pidfd;
  if (flags & CLONE_PARENT_SETTID) args.parent_tid = (uint64_t)(uintptr_t)parent_tid;
  if (flags & CLONE_INTO_CGROUP) args.cgroup = (uint64_t)cgroup_fd;
  long r = clone3_raw(&args, sizeof args, fn, arg);
  if (r < 0) {
    errno = (int)-r;
    return -1;
  }
  return (pid_t)r;
#else
  (void)fn, (void)arg, (void)stack, (void)stack_size, (void)flags, (void)exit_signal, (void)cgroup_fd, (void)pidfd, (void)parent_tid;
  errno = ENOSYS;
  return -1;
#endif
}
