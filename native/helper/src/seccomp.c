/*
 * The default seccomp filter of every sandbox process: a denylist over the
 * native x86_64 (or aarch64) syscall table.
 *
 *  - non-native architectures (i386 via int 0x80 on x86_64) and the x32 ABI: the
 *    process is killed; their syscall numbers differ, so the denylist below would
 *    not apply to them;
 *  - the escape syscalls (mount API, namespaces, keyrings, bpf, kexec, modules,
 *    open_by_handle_at, ...): EPERM, so tools fail with a clear error;
 *  - clone with any CLONE_NEW* flag: EPERM; clone3 (flags in memory, cannot be
 *    inspected): ENOSYS, so libc falls back to clone;
 *  - ioctl TIOCSTI / TIOCLINUX: EPERM, comparing only the low 32 bits of the
 *    command (the kernel truncates it to unsigned int; TIOCSTI | 1 << 32 is caught);
 *  - socket(AF_PACKET, ...) and SOCK_RAW of any family: EPERM;
 *  - optional groups (ptrace, io_uring, userfaultfd, perf_event_open) are denied
 *    unless the policy allows them (WN_SC_ALLOW_*).
 *
 * The program is built once per allow-mask and cached: applying it is one
 * seccomp(2) call in the child.
 */
#include "wn.h"
#include "confine.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/prctl.h>

#ifndef TIOCSTI
#define TIOCSTI 0x5412
#endif
#ifndef TIOCLINUX
#define TIOCLINUX 0x541C
#endif
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

#if defined(__x86_64__)
#define WN_AUDIT_ARCH AUDIT_ARCH_X86_64
#define WN_X32_BIT 0x40000000u
#elif defined(__aarch64__)
#define WN_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "seccomp filter: unsupported architecture"
#endif

#define RET_ERRNO(e) (SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))
#define NR_OFF offsetof(struct seccomp_data, nr)
#define ARCH_OFF offsetof(struct seccomp_data, arch)
/* Low 32 bits of argument i (little endian). */
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))

/*
 * Always denied with EPERM. The capability-gated rest (swapon, reboot, settimeofday, ...) is left
 * to the dropped capabilities: the filter cannot be used to regain them (no user namespaces), and
 * every instruction here costs ~1-3 us at each process start (the kernel JIT-compiles the filter
 * on every attach), so the list is what the threat model needs, merged into number ranges.
 */
static const long k_denied[] = {
    SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot, SYS_unshare, SYS_setns, SYS_keyctl, SYS_add_key,
    SYS_request_key, SYS_bpf, SYS_kexec_load, SYS_kexec_file_load, SYS_open_by_handle_at, SYS_name_to_handle_at,
    SYS_init_module, SYS_finit_module, SYS_delete_module, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
    SYS_move_mount, SYS_open_tree, SYS_mount_setattr,
};
static const long k_ptrace[] = {SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev};
static const long k_io_uring[] = {SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register};
static const long k_userfaultfd[] = {SYS_userfaultfd};
static const long k_perf[] = {SYS_perf_event_open};

#define MAX_INSNS 128
#define MAX_DENY 64
struct built {
  struct sock_filter insns[MAX_INSNS];
  struct sock_fprog prog;
  int ready;
};
static struct built g_cache[(WN_SC_ALLOW_ALL | WN_SC_ZYGOTE) + 1];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* A tiny assembler: jumps name labels, resolved once the layout is known. */
enum { L_NEXT = -1, L_ALLOW = -2, L_EPERM = -3, L_ENOSYS = -4, L_KILL = -5 };
struct asm_insn {
  struct sock_filter f;
  int jt, jf; /* label or L_NEXT; for plain jumps (JA) jt is the target */
};
struct asm_prog {
  struct asm_insn in[MAX_INSNS];
  int n;
};
static int emit(struct asm_prog *p, uint16_t code, uint32_t k, int jt, int jf) {
  if (p->n >= MAX_INSNS) return -1;
  p->in[p->n++] = (struct asm_insn){{code, 0, 0, k}, jt, jf};
  return 0;
}

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

static int build(unsigned allow, struct sock_filter *out) {
  long nrs[MAX_DENY];
  size_t n = 0;
#define ADD(list)                                                                   \
  for (size_t i_ = 0; i_ < sizeof(list) / sizeof(list[0]); i_++) \
    if (n < MAX_DENY) nrs[n++] = list[i_];
  for (size_t i_ = 0; i_ < sizeof(k_denied) / sizeof(k_denied[0]); i_++)
    if (n < MAX_DENY && !((allow & WN_SC_ZYGOTE) && k_denied[i_] == SYS_unshare)) nrs[n++] = k_denied[i_];
  if (!(allow & WN_SC_ALLOW_PTRACE)) ADD(k_ptrace);
  if (!(allow & WN_SC_ALLOW_IO_URING)) ADD(k_io_uring);
  if (!(allow & WN_SC_ALLOW_USERFAULTFD)) ADD(k_userfaultfd);
  if (!(allow & WN_SC_ALLOW_PERF)) ADD(k_perf);
#undef ADD
  qsort(nrs, n, sizeof nrs[0], cmp_long);

  struct asm_prog p = {.n = 0};
  int rc = 0;
  /* architecture, then the x32 bit */
  rc |= emit(&p, BPF_LD | BPF_W | BPF_ABS, ARCH_OFF, 0, 0);
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, WN_AUDIT_ARCH, L_NEXT, L_KILL);
  rc |= emit(&p, BPF_LD | BPF_W | BPF_ABS, NR_OFF, 0, 0);
#ifdef WN_X32_BIT
  rc |= emit(&p, BPF_JMP | BPF_JGE | BPF_K, WN_X32_BIT, L_KILL, L_NEXT);
#endif
  /* denied numbers, merged into ranges [lo, hi] */
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && nrs[j + 1] <= nrs[j] + 1) j++;
    if (nrs[i] == nrs[j]) {
      rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nrs[i], L_EPERM, L_NEXT);
    } else {
      /* nr >= lo && !(nr > hi) */
      int skip = p.n + 2; /* the instruction after this pair */
      rc |= emit(&p, BPF_JMP | BPF_JGE | BPF_K, (uint32_t)nrs[i], L_NEXT, skip);
      rc |= emit(&p, BPF_JMP | BPF_JGT | BPF_K, (uint32_t)nrs[j], L_NEXT, L_EPERM);
    }
    i = j + 1;
  }
  /* clone3: its flags live in user memory; ENOSYS makes libc fall back to clone */
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, L_ENOSYS, L_NEXT);
  /* clone without namespace flags (x86_64 and aarch64: flags are arg 0) */
  int after_clone = p.n + 3;
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, L_NEXT, after_clone);
  rc |= emit(&p, BPF_LD | BPF_W | BPF_ABS, ARG_LO(0), 0, 0);
  rc |= emit(&p, BPF_JMP | BPF_JSET | BPF_K,
             CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP |
                 CLONE_NEWTIME,
             L_EPERM, L_ALLOW);
  /* ioctl TIOCSTI / TIOCLINUX, low 32 bits of the command */
  int after_ioctl = p.n + 4;
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, L_NEXT, after_ioctl);
  rc |= emit(&p, BPF_LD | BPF_W | BPF_ABS, ARG_LO(1), 0, 0);
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI, L_EPERM, L_NEXT);
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, TIOCLINUX, L_EPERM, L_ALLOW);
  /* socket: no AF_PACKET, no SOCK_RAW */
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, L_NEXT, L_ALLOW);
  rc |= emit(&p, BPF_LD | BPF_W | BPF_ABS, ARG_LO(0), 0, 0);
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, AF_PACKET, L_EPERM, L_NEXT);
  rc |= emit(&p, BPF_LD | BPF_W | BPF_ABS, ARG_LO(1), 0, 0);
  rc |= emit(&p, BPF_ALU | BPF_AND | BPF_K, 0xf /* SOCK_TYPE_MASK */, 0, 0);
  rc |= emit(&p, BPF_JMP | BPF_JEQ | BPF_K, SOCK_RAW, L_EPERM, L_ALLOW);
  if (rc < 0 || p.n + 5 > MAX_INSNS) return -1;
  /* the shared returns */
  int at[5];
  at[-L_ALLOW - 1] = p.n;
  emit(&p, BPF_RET | BPF_K, SECCOMP_RET_ALLOW, 0, 0);
  at[-L_EPERM - 1] = p.n;
  emit(&p, BPF_RET | BPF_K, RET_ERRNO(EPERM), 0, 0);
  at[-L_ENOSYS - 1] = p.n;
  emit(&p, BPF_RET | BPF_K, RET_ERRNO(ENOSYS), 0, 0);
  at[-L_KILL - 1] = p.n;
  emit(&p, BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS, 0, 0);
  /* resolve labels into relative offsets */
  for (int i = 0; i < p.n; i++) {
    struct asm_insn *x = &p.in[i];
    out[i] = x->f;
    uint16_t cls = BPF_CLASS(x->f.code);
    if (cls != BPF_JMP) continue;
    int targets[2] = {x->jt, x->jf};
    int off[2] = {0, 0};
    for (int k = 0; k < (BPF_OP(x->f.code) == BPF_JA ? 1 : 2); k++) {
      int tgt = targets[k] == L_NEXT ? i + 1 : targets[k] < 0 ? at[-targets[k] - 1] : targets[k];
      off[k] = tgt - (i + 1);
      if (off[k] < 0 || off[k] > 255) return -1;
    }
    if (BPF_OP(x->f.code) == BPF_JA) {
      out[i].k = (uint32_t)off[0];
    } else {
      out[i].jt = (uint8_t)off[0];
      out[i].jf = (uint8_t)off[1];
    }
  }
  return p.n;
}

const struct sock_fprog *wn_seccomp_filter(unsigned allow) {
  allow &= WN_SC_ALLOW_ALL | WN_SC_ZYGOTE;
  struct built *b = &g_cache[allow];
  if (__atomic_load_n(&b->ready, __ATOMIC_ACQUIRE)) return &b->prog;
  pthread_mutex_lock(&g_lock);
  if (!b->ready) {
    int n = build(allow, b->insns);
    if (n > 0) {
      b->prog.len = (unsigned short)n;
      b->prog.filter = b->insns;
      __atomic_store_n(&b->ready, 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&g_lock);
  return b->ready ? &b->prog : NULL;
}

int wn_seccomp_supported(void) {
  if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0) return 0;
  /* SECCOMP_GET_ACTION_AVAIL answers without installing anything */
  uint32_t action = SECCOMP_RET_KILL_PROCESS;
  return syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) == 0;
}
