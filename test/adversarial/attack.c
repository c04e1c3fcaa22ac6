/*
 * Adversarial probe run INSIDE a sandbox (compiled static on the host by
 * test/adversarial/helpers.ts and copied in). Each subcommand tries one attack
 * with raw syscalls and prints one line:
 *   "ALLOWED"            the kernel let it through
 *   "DENIED <ERRNO>"     it failed with that errno
 * Attacks that should kill the process (x32, int 0x80) die of SIGSYS before printing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

static int report(long r) {
  if (r < 0) {
    printf("DENIED %s\n", strerrorname_np(errno) ? strerrorname_np(errno) : "?");
    return 1;
  }
  printf("ALLOWED\n");
  return 0;
}

static int child_fn(void *arg) { return 0; }

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *a = argv[1];
  const char *arg = argc > 2 ? argv[2] : "";
  if (!strcmp(a, "mount")) return report(mount("none", "/mnt", "tmpfs", 0, NULL));
  if (!strcmp(a, "umount")) return report(umount2("/proc", MNT_DETACH));
  if (!strcmp(a, "pivot_root")) return report(syscall(SYS_pivot_root, "/tmp", "/tmp"));
  if (!strcmp(a, "unshare-user")) return report(unshare(CLONE_NEWUSER));
  if (!strcmp(a, "unshare-mnt")) return report(unshare(CLONE_NEWNS));
  if (!strcmp(a, "clone-newuser")) {
    static char stack[65536];
    long r = clone(child_fn, stack + sizeof stack, CLONE_NEWUSER | SIGCHLD, NULL);
    if (r > 0) waitpid((pid_t)r, NULL, 0);
    return report(r);
  }
  if (!strcmp(a, "clone3")) {
    struct clone_args ca;
    memset(&ca, 0, sizeof ca);
    ca.flags = CLONE_NEWUSER;
    ca.exit_signal = SIGCHLD;
    long r = syscall(SYS_clone3, &ca, sizeof ca);
    if (r == 0) _exit(0);
    if (r > 0) waitpid((pid_t)r, NULL, 0);
    return report(r);
  }
  if (!strcmp(a, "setns")) {
    int fd = open(arg[0] ? arg : "/proc/1/ns/mnt", O_RDONLY);
    if (fd < 0) return report(-1);
    return report(setns(fd, 0));
  }
  if (!strcmp(a, "keyctl")) return report(syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3, 0));
  if (!strcmp(a, "add_key")) return report(syscall(SYS_add_key, "user", "warren", "x", 1, -3));
  if (!strcmp(a, "request_key")) return report(syscall(SYS_request_key, "user", "warren", NULL, 0));
  if (!strcmp(a, "bpf")) {
    char attr[128];
    memset(attr, 0, sizeof attr);
    return report(syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, attr, sizeof attr));
  }
  if (!strcmp(a, "perf_event_open")) {
    char attr[128];
    memset(attr, 0, sizeof attr);
    *(uint32_t *)(attr + 4) = 128;
    return report(syscall(SYS_perf_event_open, attr, 0, -1, -1, 0));
  }
  if (!strcmp(a, "kexec_load")) return report(syscall(SYS_kexec_load, 0, 0, NULL, 0));
  if (!strcmp(a, "kexec_file_load")) return report(syscall(SYS_kexec_file_load, -1, -1, 0, "", 0));
  if (!strcmp(a, "open_by_handle_at")) {
    char h[64];
    memset(h, 0, sizeof h);
    *(unsigned *)h = 8;
    return report(syscall(SYS_open_by_handle_at, AT_FDCWD, h, O_RDONLY));
  }
  if (!strcmp(a, "init_module")) return report(syscall(SYS_init_module, "", 0, ""));
  if (!strcmp(a, "finit_module")) return report(syscall(SYS_finit_module, 0, "", 0));
  if (!strcmp(a, "delete_module")) return report(syscall(SYS_delete_module, "ext4", O_NONBLOCK));
  if (!strcmp(a, "userfaultfd")) return report(syscall(SYS_userfaultfd, O_CLOEXEC));
  if (!strcmp(a, "io_uring_setup")) {
    char p[120];
    memset(p, 0, sizeof p);
    return report(syscall(SYS_io_uring_setup, 4, p));
  }
  if (!strcmp(a, "ptrace-attach")) return report(ptrace(PTRACE_ATTACH, (pid_t)atoi(arg), NULL, NULL));
  if (!strcmp(a, "ptrace-traceme")) return report(ptrace(PTRACE_TRACEME, 0, NULL, NULL));
  if (!strcmp(a, "process_vm_readv")) return report(syscall(SYS_process_vm_readv, 1, NULL, 0, NULL, 0, 0));
  if (!strcmp(a, "chroot")) return report(chroot("/tmp"));
  if (!strcmp(a, "tiocsti") || !strcmp(a, "tiocsti64") || !strcmp(a, "tioclinux")) {
    int fd = open("/dev/tty", O_RDWR);
    if (fd < 0) fd = 0;
    char c = 'x';
    unsigned long cmd = !strcmp(a, "tioclinux") ? TIOCLINUX : TIOCSTI;
    if (!strcmp(a, "tiocsti64")) cmd |= 1UL << 32;
    char sub = 6; /* TIOCLINUX subcode: get selection/shift state */
    return report(syscall(SYS_ioctl, fd, cmd, !strcmp(a, "tioclinux") ? &sub : &c));
  }
  if (!strcmp(a, "packet-socket")) return report(socket(AF_PACKET, SOCK_RAW, 0));
  if (!strcmp(a, "raw-socket")) return report(socket(AF_INET, SOCK_RAW, 1 /* ICMP */));
  if (!strcmp(a, "raw6-socket")) return report(socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, 58));
  if (!strcmp(a, "tcp-socket")) return report(socket(AF_INET, SOCK_STREAM, 0));
  if (!strcmp(a, "x32")) return report(syscall(0x40000000 | 39 /* getpid via x32 */));
  if (!strcmp(a, "int80")) {
    long r;
    /* i386 mount (21) through the 32-bit entry point */
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(21L), "b"(0L), "c"(0L), "d"(0L) : "memory");
    if (r < 0) errno = (int)-r;
    return report(r < 0 ? -1 : 0);
  }
  if (!strcmp(a, "write")) {
    int fd = open(arg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return report(-1);
    return report(write(fd, "1", 1));
  }
  if (!strcmp(a, "read")) {
    int fd = open(arg, O_RDONLY);
    if (fd < 0) return report(-1);
    char buf[64];
    long n = read(fd, buf, sizeof buf);
    if (n == 0) {
      printf("EMPTY\n");
      return 0;
    }
    return report(n);
  }
  if (!strcmp(a, "kill")) return report(kill((pid_t)atoi(arg), SIGKILL));
  if (!strcmp(a, "mknod")) return report(mknod("/tmp/sda", S_IFBLK | 0600, makedev(8, 0)));
  if (!strcmp(a, "fds")) {
    int n = 0;
    while (open("/dev/null", O_RDONLY) >= 0) n++;
    printf("OPENED %d %s\n", n, strerrorname_np(errno));
    return 0;
  }
  if (!strcmp(a, "setuid-root-caps")) {
    /* capability set of this process */
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
      if (!strncmp(line, "CapEff", 6) || !strncmp(line, "CapBnd", 6) || !strncmp(line, "NoNewPrivs", 10) || !strncmp(line, "Seccomp:", 8)) fputs(line, stdout);
    return 0;
  }
  if (!strcmp(a, "abstract-listen") || !strcmp(a, "abstract-connect")) {
    /* abstract unix socket "@<arg>": listen (and wait for one connection) or connect */
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(arg);
    memcpy(sa.sun_path + 1, arg, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return report(-1);
    if (!strcmp(a, "abstract-connect")) return report(connect(fd, (struct sockaddr *)&sa, len));
    if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, 4) < 0) return report(-1);
    printf("LISTENING\n");
    fflush(stdout);
    int c = accept(fd, NULL, NULL);
    return report(c);
  }
  fprintf(stderr, "unknown attack %s\n", a);
  return 2;
}
