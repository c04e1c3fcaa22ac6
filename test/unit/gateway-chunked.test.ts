/**
 * Chunked answers written with back-pressure arrive byte for byte: a real
 * hyper-express server writes a large body in chunks through writeChunk()
 * (the path of tar downloads, image import progress and exec answers) to a
 * client that reads slowly.
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import HyperExpress from 'hyper-express';
import { request } from 'undici';
import { endChunked, writeChunk } from '../../src/gateway/http';

test('a chunked body written faster than the client reads is neither duplicated nor cut', async (t) => {
  const data = randomBytes(12 << 20);
  const app = new HyperExpress.Server();
  let gone = 0;
  app.get('/body', async (_req, res) => {
    res.status(200);
    for (let i = 0; i < data.length; i += 100_000) {
      if (!(await writeChunk(res, data.subarray(i, i + 100_000)))) {
        gone++;
        return;
      }
    }
    endChunked(res);
  });
  await app.listen(0, '127.0.0.1');
  t.teardown(() => app.close());
  const res = await request(`http://127.0.0.1:${app.port}/body`);
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of res.body) {
    chunks.push(c as Buffer);
    // read slowly at first, so that the server meets back-pressure
    if (n++ < 50) await new Promise((r) => setTimeout(r, 5));
  }
  const got = Buffer.concat(chunks);
  t.is(got.length, data.length);
  t.true(got.equals(data));
  t.is(gone, 0);
});

test('writeChunk resolves false once the client is gone, and the handler stops', async (t) => {
  const app = new HyperExpress.Server();
  let resolveStopped!: (n: number) => void;
  const stopped = new Promise<number>((r) => (resolveStopped = r));
  app.get('/endless', async (_req, res) => {
    res.status(200);
    let written = 0;
    for (;;) {
      if (!(await writeChunk(res, randomBytes(64 * 1024)))) break;
      written++;
    }
    resolveStopped(written);
  });
  await app.listen(0, '127.0.0.1');
  t.teardown(() => app.close());
  const ac = new AbortController();
  const res = await request(`http://127.0.0.1:${app.port}/endless`, { signal: ac.signal });
  let seen = 0;
  try {
    for await (const c of res.body) {
      seen += (c as Buffer).length;
      if (seen > 1 << 20) ac.abort();
    }
  } catch {
    /* aborted on purpose */
  }
  const written = await stopped;
  t.true(written > 0);
});
