/**
 * Jobs in the SDK (`client.jobs`, a cluster gateway: docs/cluster.md): one
 * call for up to 32,768 sandboxes, progress streamed as NDJSON.
 *
 *   const job = await client.jobs.create({ count: 2000, template: { image: 'busybox' } });
 *   const end = await client.jobs.watch(job.id, (ev) => { if (ev.type === 'progress') bar(ev.created / ev.count); });
 *   await client.jobs.pause(job.id); await client.jobs.resume(job.id); await client.jobs.delete(job.id);
 */
import type { WarrenClient, CreateSandboxRequest } from './index';
import { NdjsonDecoder } from './ndjson';
import type { JobStatus } from '../cluster/jobs';
import type { SandboxInfo } from '../shim/types';

export type { JobStatus, JobState, NodeShareStatus } from '../cluster/jobs';

export interface PlacementAsk {
  /** Node labels the nodes must carry. */
  nodeSelector?: Record<string, string>;
  /** Only these nodes. */
  nodes?: string[];
}

export interface CreateJobRequest {
  count: number;
  template: CreateSandboxRequest & { placement?: PlacementAsk };
  /** Labels on every sandbox of the job (warren.job=<id> is added). */
  labels?: Record<string, string>;
  /** Creates in flight per node for this job (the node's own window bounds it too). */
  concurrency?: number;
  /** Over quota: refuse the whole job ("all", default) or admit as many as fit ("upTo"). */
  quota?: 'all' | 'upTo';
  placement?: PlacementAsk;
}

export interface CreatedJob {
  id: string;
  /** Admitted (less than requested with quota "upTo"). */
  count: number;
  requested: number;
  placed: Record<string, number>;
  pending: number;
  explain?: unknown;
}

export type JobEvent =
  | ({ type: 'status' } & JobStatus)
  | { type: 'progress'; state: JobStatus['state']; created: number; failed: number; lost: number; pending: number; paused: number; count: number }
  | { type: 'sandboxes'; node: string; ids: string[] }
  | { type: 'lost'; node: string; epoch: number; count: number }
  | ({ type: 'done' } & JobStatus);

export class JobsApi {
  constructor(private readonly client: WarrenClient) {}

  create(req: CreateJobRequest, opts: { explain?: boolean } = {}): Promise<CreatedJob> {
    return this.client.requestJson('POST', '/v1/jobs', { json: req, ...(opts.explain ? { query: { explain: '1' } } : {}) });
  }

  get(id: string): Promise<JobStatus> {
    return this.client.requestJson('GET', `/v1/jobs/${encodeURIComponent(id)}`);
  }

  async list(): Promise<JobStatus[]> {
    return (await this.client.requestJson<{ jobs: JobStatus[] }>('GET', '/v1/jobs')).jobs;
  }

  async sandboxes(id: string): Promise<SandboxInfo[]> {
    return (await this.client.requestJson<{ sandboxes: SandboxInfo[] }>('GET', `/v1/jobs/${encodeURIComponent(id)}/sandboxes`)).sandboxes;
  }

  /** Follow a job until it ends (done, partial, cancelled, deleted); resolves with the final status. */
  async watch(id: string, onEvent?: (ev: JobEvent) => void): Promise<JobStatus> {
    const res = await this.client.request('GET', `/v1/jobs/${encodeURIComponent(id)}`, { query: { follow: '1' }, headers: { accept: 'application/x-ndjson' }, headersTimeout: 600_000, bodyTimeout: 3_600_000 });
    const decoder = new NdjsonDecoder();
    let done: JobStatus | null = null;
    const handle = (v: unknown) => {
      const ev = v as JobEvent;
      onEvent?.(ev);
      if (ev.type === 'done') {
        const { type: _t, ...st } = ev;
        done = st as JobStatus;
      }
    };
    for await (const chunk of res.body) for (const v of decoder.push(chunk as Buffer)) handle(v);
    for (const v of decoder.end()) handle(v);
    if (done === null) throw new Error(`the progress stream of job ${id} ended before the job did`);
    return done;
  }

  pause(id: string): Promise<{ id: string; state: string }> {
    return this.client.requestJson('POST', `/v1/jobs/${encodeURIComponent(id)}/pause`);
  }

  resume(id: string): Promise<{ id: string; state: string }> {
    return this.client.requestJson('POST', `/v1/jobs/${encodeURIComponent(id)}/resume`);
  }

  cancel(id: string): Promise<{ id: string; state: string }> {
    return this.client.requestJson('POST', `/v1/jobs/${encodeURIComponent(id)}/cancel`);
  }

  delete(id: string): Promise<{ id: string; state: string }> {
    return this.client.requestJson('DELETE', `/v1/jobs/${encodeURIComponent(id)}`);
  }
}
