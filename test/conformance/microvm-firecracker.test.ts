/**
 * The conformance suite for microVMs under Firecracker (the same backend,
 * another VmmDriver): where the firecracker binary (>= 1.8) and KVM that runs
 * the guest are there. Skipped with the probe's reason elsewhere (this
 * machine: not installed, and its KVM is PVM).
 */
import test from 'ava';
import { rm } from 'node:fs/promises';
import { skipReason } from '../../src/features';
import { MicroVMBackend } from '../../src/shim/backends/microvm/backend';
import { firecracker } from '../../src/shim/backends/microvm/firecracker';
import { backendConformance } from './backend-suite';
import { microvmHarness } from '../helpers/microvm-harness';

const skip = skipReason('native-helper', 'microvm-guest', 'firecracker');

backendConformance(
  test,
  'microvm',
  () =>
    microvmHarness('c', (dir) => {
      const runRoot = `/run/warren/fc-${process.pid}`;
      const backend = new MicroVMBackend({ dataDir: dir, driver: firecracker, runRoot, log: () => undefined, bootTimeoutMs: 60_000 });
      return {
        backend,
        close: async () => {
          backend.close();
          await rm(runRoot, { recursive: true, force: true });
          await rm(`${runRoot}-jail`, { recursive: true, force: true });
        },
      };
    }),
  skip,
);
