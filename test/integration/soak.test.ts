/**
 * The soak (bench/soak.ts) at a size the suite can afford: create/delete cycles with execs, shell
 * sessions, pauses and two kill -9 of the gateway, then exact leak counts.
 */
import { runSoak, soakLeaks } from '../../bench/soak';
import { skipReason } from '../../src/features';
import { testUnless } from '../helpers/skip';

const why = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'cgroup-freezer');

testUnless(why)('soak: 240 cycles with execs, shells, pauses and 2 gateway kill -9, then nothing leaked', async (t) => {
  t.timeout(300_000);
  const network = skipReason('egress-bpf', 'sandbox-network') === null;
  const seed = Math.floor(Math.random() * 2 ** 31);
  t.log(`seed ${seed} (SOAK_SEED=${seed} SOAK_CYCLES=240 SOAK_KILLS=2 replays it with npm run bench:soak), network ${network}`);
  const r = await runSoak({ cycles: 240, concurrency: 3, kills: 2, network, seed, log: (l) => t.log(l) });
  t.log(`${r.completed} completed, ${r.interrupted} interrupted by the kills, ${r.seconds.toFixed(1)} s; fds ${JSON.stringify(r.gatewayFds)}, RSS MiB ${JSON.stringify(r.gatewayRssMiB)}`);
  t.deepEqual(r.errors, []);
  t.true(r.completed >= 240 - 3 * 2 * 2, `most cycles complete (${r.completed})`);
  t.deepEqual(soakLeaks(r), []);
  t.is(r.idle.sandboxes, 0);
});
