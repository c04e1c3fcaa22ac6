/**
 * Spans (create with its phases, exec, delete) and metrics (create latency,
 * live sandboxes) are exported over OTLP/HTTP to a real collector endpoint
 * started by the test.
 */
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { skipReason } from '../../src/features';
import { initTelemetry } from '../../src/telemetry';
import { spec, withShim } from '../helpers/warren';
import { testUnless } from '../helpers/skip';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip);

function body(req: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
  });
}

it(`create, exec and delete are traced and measured over OTLP`, async (t) => {
  const received: Record<string, string[]> = { '/v1/traces': [], '/v1/metrics': [] };
  const collector = createServer(async (req, res) => {
    received[req.url ?? '']?.push(await body(req));
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
  });
  await new Promise<void>((r) => collector.listen(0, '127.0.0.1', r));
  const endpoint = `http://127.0.0.1:${(collector.address() as AddressInfo).port}`;
  const telemetry = initTelemetry({ nodeId: 'otel-test', otlpEndpoint: endpoint, metricIntervalMs: 60_000 });
  try {
    await withShim(t, async ({ shim }) => {
      const { id } = await shim.createSandbox(spec());
      await shim.exec(id, { cmd: ['true'] });
      await shim.deleteSandbox(id);
      await telemetry.forceFlush();
    });
    const traces = received['/v1/traces']!.join('\n');
    for (const name of ['warren.sandbox.create', 'warren.sandbox.create.layers', 'warren.sandbox.create.spawn', 'warren.sandbox.exec', 'warren.sandbox.delete']) {
      t.true(traces.includes(`"${name}"`), `span ${name} exported`);
    }
    t.true(traces.includes('"service.name"') && traces.includes('"warren"'));
    const metricsBody = received['/v1/metrics']!.join('\n');
    t.true(metricsBody.includes('warren.sandbox.create.duration'), 'create latency histogram exported');
    t.true(metricsBody.includes('warren.sandboxes.live'), 'live sandboxes gauge exported');
  } finally {
    await telemetry.shutdown();
    collector.close();
  }
});
