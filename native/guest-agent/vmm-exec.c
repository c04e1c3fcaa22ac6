/*
 * warren-vmm-exec: exec a microVM's VMM with transparent huge pages off for
 * its whole address space (PR_SET_THP_DISABLE survives execve).
 *
 * A VM restored from a snapshot gets resident only the pages the snapshot
 * holds data for. With THP, QEMU's guest RAM (which it madvises for huge
 * pages) is faulted in 2 MiB at a time, so a few scattered pages make nearly
 * all of guest RAM resident; with 4 KiB pages only what the guest uses is.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 3 || strcmp(argv[1], "--") != 0) {
    fprintf(stderr, "usage: warren-vmm-exec -- COMMAND [ARG...]\n");
    return 2;
  }
  if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)) {
    perror("warren-vmm-exec: PR_SET_THP_DISABLE");
    return 1;
  }
  execvp(argv[2], argv + 2);
  perror("warren-vmm-exec: exec");
  return 127;
}
