import { openTestShim } from './helpers/warren';
import { execFileSync } from 'node:child_process';
const pct = (a: number[], p: number) => [...a].sort((x, y) => x - y)[Math.floor((a.length - 1) * p / 100)]!;
(async () => {
  const { shim } = await openTestShim({ nodeId: 'fp' + process.pid.toString(36) });
  await shim.functions.ensureJudgeImage();
  const { mkdtempSync, mkdirSync, writeFileSync } = require('node:fs');
  const tk = mkdtempSync('/tmp/tk-'); mkdirSync(tk + '/usr/local/bin', { recursive: true }); writeFileSync(tk + '/usr/local/bin/x', 'x');
  await shim.importImage({ name: 'tk', kind: 'toolkit', source: { type: 'directory', path: tk } } as never);
  shim.functions.createPool({ name: 'p', image: 'judge', min: 4, max: 4 } as never, 'api' as never);
  shim.functions.createPool({ name: 'q', image: 'judge', layers: ['tk'], min: 4, max: 4 } as never, 'api' as never);
  await new Promise((r) => setTimeout(r, 3000));
  const cases: [string, any][] = [
    ['true', { cmd: ['true'] }],
    ['py -c', { cmd: ['python3', '-c', 'print("hello")'] }],
    ['py code', { code: 'print("hello")\n', language: 'python3' }],
    ['py -I -S', { cmd: ['python3', '-I', '-S', '-c', 'print("hello")'] }],
  ];
  for (const pool of ['p', 'q', 'p', 'q']) for (const [name, req] of cases.slice(2, 3)) {
    const tot: number[] = [], wall: number[] = [];
    for (let i = 0; i < 60; i++) {
      const t = performance.now();
      const r = await shim.functions.invoke(pool, 'acct', { files: [], stdin: Buffer.alloc(0), env: {}, fetchFiles: [], ...req } as never);
      tot.push(performance.now() - t); wall.push(r.wallMs);
      if (r.status !== 'ok') { console.log(r); break; }
    }
    console.log(pool, name.padEnd(10), 'total p50', pct(tot, 50).toFixed(2), 'wall p50', pct(wall, 50).toFixed(2));
  }
  const host = (args: string[]) => { const a: number[] = []; for (let i = 0; i < 40; i++) { const t = performance.now(); execFileSync('/usr/bin/python3', args); a.push(performance.now() - t); } return pct(a, 50).toFixed(2); };
  console.log('host py -c', host(['-c', 'print("hello")']), 'host -I -S', host(['-I', '-S', '-c', 'print("hello")']));
  await shim.close();
  shim.layers.unmountUnused();
  process.exit(0);
})();
