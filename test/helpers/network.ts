/** Skip reasons for network tests, from the one feature-detection module. */
import { existsSync } from 'node:fs';

export function egressSkipReason(): string | null {
  if (process.getuid?.() !== 0) return 'requires root';
  if (!existsSync('/sys/fs/cgroup/unified/cgroup.procs') && !existsSync('/sys/fs/cgroup/cgroup.procs')) return 'no cgroup2 hierarchy for BPF programs';
  return null;
}
