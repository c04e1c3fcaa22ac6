/** `warren up` outlives its log reader: a closed stdout/stderr pipe loses lines, not the server. */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { removeTree } from '../../src/shim/layers/sys';
import { rootSkipReason } from '../helpers/warren';
import { kill9, startWarrenProcess } from '../helpers/warren-process';
import { testUnless } from '../helpers/skip';
import { waitFor } from '../helpers/wait';

testUnless(rootSkipReason())('warren up keeps serving after the reader of its stdout and stderr goes away', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-logpipe-'));
  const { child, url } = await startWarrenProcess(dataDir, `lp${process.pid % 10000}`);
  try {
    child.stdout!.destroy();
    child.stderr!.destroy();
    // SIGHUP makes the server log a line (the policy reload) to the closed pipes, twice over
    for (let i = 0; i < 2; i++) {
      child.kill('SIGHUP');
      await waitFor(async () => (await fetch(`${url}/v1/health`).then((r) => r.status, () => 0)) === 200, 5000, 'the server to answer after the reload');
    }
    t.is(child.exitCode, null, 'still running');
    t.is(child.signalCode, null);
    t.is((await fetch(`${url}/v1/health`)).status, 200);
  } finally {
    await kill9(child);
    removeTree(dataDir);
  }
});
