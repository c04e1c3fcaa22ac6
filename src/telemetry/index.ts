/**
 * OpenTelemetry wiring. Spans and metrics are always produced through the
 * global API (cheap no-ops when nothing is installed); `initTelemetry` installs
 * providers that export over OTLP/HTTP when an endpoint is configured.
 */
import { metrics, trace, SpanStatusCode, type Attributes, type Span } from '@opentelemetry/api';
import { BasicTracerProvider, BatchSpanProcessor, SimpleSpanProcessor, type SpanExporter } from '@opentelemetry/sdk-trace-base';
import { MeterProvider, PeriodicExportingMetricReader, type IMetricReader } from '@opentelemetry/sdk-metrics';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPMetricExporter } from '@opentelemetry/exporter-metrics-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { WarrenError } from '../errors';
import { keepRecent } from './recent';

const VERSION = '0.1.0';

export interface TelemetryOptions {
  /** Base URL of an OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (traces go to /v1/traces, metrics to /v1/metrics). */
  otlpEndpoint?: string;
  nodeId: string;
  /** For tests: export spans synchronously to this exporter. */
  spanExporter?: SpanExporter;
  metricReader?: IMetricReader;
  metricIntervalMs?: number;
}

export interface Telemetry {
  shutdown(): Promise<void>;
  forceFlush(): Promise<void>;
}

let installed: { tracer: BasicTracerProvider; meter: MeterProvider } | null = null;

export function initTelemetry(opts: TelemetryOptions): Telemetry {
  if (installed !== null) throw new WarrenError('ALREADY_EXISTS', 'telemetry is already initialised in this process');
  const resource = resourceFromAttributes({ 'service.name': 'warren', 'service.version': VERSION, 'warren.node': opts.nodeId });
  const spanProcessors = [];
  if (opts.spanExporter) spanProcessors.push(new SimpleSpanProcessor(opts.spanExporter));
  if (opts.otlpEndpoint) spanProcessors.push(new BatchSpanProcessor(new OTLPTraceExporter({ url: `${opts.otlpEndpoint.replace(/\/$/, '')}/v1/traces` })));
  const tracer = new BasicTracerProvider({ resource, spanProcessors });
  const readers: IMetricReader[] = [];
  if (opts.metricReader) readers.push(opts.metricReader);
  if (opts.otlpEndpoint) {
    readers.push(
      new PeriodicExportingMetricReader({
        exporter: new OTLPMetricExporter({ url: `${opts.otlpEndpoint.replace(/\/$/, '')}/v1/metrics` }),
        exportIntervalMillis: opts.metricIntervalMs ?? 10_000,
      }),
    );
  }
  const meter = new MeterProvider({ resource, readers });
  trace.setGlobalTracerProvider(tracer);
  metrics.setGlobalMeterProvider(meter);
  installed = { tracer, meter };
  return {
    forceFlush: async () => {
      await tracer.forceFlush();
      await meter.forceFlush();
    },
    shutdown: async () => {
      await tracer.shutdown();
      await meter.shutdown();
      trace.disable();
      metrics.disable();
      installed = null;
    },
  };
}

export function tracer() {
  return trace.getTracer('warren', VERSION);
}

/** Run `fn` in a span named `name`; errors mark the span and propagate. */
export async function inSpan<T>(name: string, attributes: Attributes, fn: (span: Span) => Promise<T> | T): Promise<T> {
  return tracer().startActiveSpan(name, { attributes }, async (span) => {
    try {
      return await fn(span);
    } catch (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
      if (err instanceof WarrenError) span.setAttribute('warren.error.code', err.code);
      throw err;
    } finally {
      span.end();
    }
  });
}

/** The instruments Warren records. Created lazily against whatever provider is installed. */
export function instruments() {
  const meter = metrics.getMeter('warren', VERSION);
  return {
    createLatency: keepRecent(
      'warren.sandbox.create.duration',
      meter.createHistogram('warren.sandbox.create.duration', {
        description: 'Time from create request to a running sandbox',
        unit: 'ms',
        advice: { explicitBucketBoundaries: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000] },
      }),
    ),
    pauseReleased: keepRecent(
      'warren.sandbox.pause.released',
      meter.createHistogram('warren.sandbox.pause.released', {
        description: 'Memory given back to the host by pausing or hibernating a sandbox',
        unit: 'By',
      }),
    ),
    coldReclaimed: meter.createHistogram('warren.sandbox.idle_reclaim.released', {
      description: 'Cold memory given back by the idle reclaim of running sandboxes',
      unit: 'By',
    }),
    execLatency: meter.createHistogram('warren.sandbox.exec.duration', {
      description: 'Exec duration, spawn to exit',
      unit: 'ms',
      advice: { explicitBucketBoundaries: [1, 2, 5, 10, 20, 50, 100, 1000, 10000] },
    }),
    liveSandboxes: meter.createObservableGauge('warren.sandboxes.live', { description: 'Sandboxes alive on this node' }),
    egressDenials: meter.createCounter('warren.egress.denials', { description: 'Connections and packets the egress programs denied (by service and hook)' }),
    dnsAnswers: meter.createCounter('warren.egress.dns.bindings', { description: 'Addresses bound into sandbox allow maps from DNS answers' }),
  };
}
