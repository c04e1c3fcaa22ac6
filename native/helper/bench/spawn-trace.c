/* Step timing of spawnSandbox + exec (build: make -C native/helper bench). Not part of the product. */
#include "../src/wn.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

extern uint64_t wn_trace_ns[64];
extern int wn_trace_n;

static uint64_t now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: spawn-trace LOWERDIR INIT [N]\n");
    return 2;
  }
  int n = argc > 3 ? atoi(argv[3]) : 10;
  for (int it = 0; it < n; it++) {
    char id[64], dir[256], up[300], wk[300], rf[300];
    snprintf(id, sizeof id, "trace-%d-%d", getpid(), it);
    snprintf(dir, sizeof dir, "/tmp/%s", id);
    snprintf(up, sizeof up, "%s/upper", dir);
    snprintf(wk, sizeof wk, "%s/work", dir);
    snprintf(rf, sizeof rf, "%s/rootfs", dir);
    mkdir(dir, 0700);
    mkdir(up, 0755);
    mkdir(wk, 0700);
    mkdir(rf, 0700);
    wn_error e;
    wn_cg_limits lim;
    wn_cg_limits_init(&lim);
    if (wn_cg_create(id, &lim, &e) < 0) {
      fprintf(stderr, "%s\n", e.msg);
      return 1;
    }
    const char *lowers[] = {argv[1], NULL};
    wn_spawn_spec s = {.id = id, .hostname = id, .lower_dirs = lowers, .n_lower = 1, .upper_dir = up, .work_dir = wk,
                       .rootfs_dir = rf, .init_path = argv[2]};
    wn_spawn_result r;
    wn_trace_n = 0;
    uint64_t t0 = now();
    if (wn_spawn_sandbox(&s, &r, &e) < 0) {
      fprintf(stderr, "%s\n", e.msg);
      return 1;
    }
    uint64_t t1 = now();
    const char *av[] = {"true", NULL};
    const char *ev[] = {"PATH=/bin", NULL};
    wn_exec_spec x = {.init_pid = r.pid, .cgroup = id, .argv = av, .argc = 1, .envp = ev, .envc = 1, .cwd = "/",
                      .stdio = WN_STDIO_PIPES};
    wn_exec_result xr;
    int spawn_n = wn_trace_n;
    uint64_t spawn_tr[64];
    memcpy(spawn_tr, wn_trace_ns, sizeof spawn_tr);
    wn_trace_n = 0;
    if (wn_exec(&x, &xr, &e) < 0) {
      fprintf(stderr, "%s\n", e.msg);
      return 1;
    }
    uint64_t t2 = now();
    siginfo_t si;
    waitid(P_PIDFD, xr.pidfd, &si, WEXITED);
    uint64_t t3 = now();
    printf("spawn %.3f exec %.3f wait %.3f | clone->child %.3f", (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6,
           (spawn_tr[0] - t0) / 1e6);
    for (int i = 1; i < spawn_n; i++) {
      double d = (spawn_tr[i] - spawn_tr[i - 1]) / 1e6;
      if (d > 0.05) printf(" [%d]%.3f", i, d);
    }
    printf(" | exec->parent %.3f || exec: pre %.3f", (t1 - spawn_tr[spawn_n - 1]) / 1e6, (wn_trace_ns[0] - t1) / 1e6);
    for (int i = 1; i < wn_trace_n; i++) printf(" [%d]%.3f", i, (wn_trace_ns[i] - wn_trace_ns[i - 1]) / 1e6);
    printf(" post %.3f\n", (t2 - wn_trace_ns[wn_trace_n - 1]) / 1e6);
    close(xr.stdin_fd);
    close(xr.stdout_fd);
    close(xr.stderr_fd);
    wn_cg_kill(id, &e);
    waitid(P_PIDFD, r.pidfd, &si, WEXITED);
    for (int k = 0; k < 1000 && wn_cg_destroy(id, &e) < 0; k++) usleep(1000);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    system(cmd);
  }
  return 0;
}
