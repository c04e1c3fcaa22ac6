/**
 * The in-process binding of the Shim contract: a gateway and its node in one
 * process (`warren up`, the embedded default). It only adapts ShimNode's own
 * API to the contract's; the remote binding (src/shim/remote) serves this
 * same object to gateways on other machines, so both are the same contract
 * by construction.
 */
import { WarrenError } from '../errors';
import type { Principal } from './access';
import { type FnCallManager, JUDGE_IMAGE } from './fncall/manager';
import { fitToPolicy } from './fncall/sandboxfusion';
import { TOOLKITS } from './fncall/toolkits';
import type { ShimNode } from './node';
import type { ContentRefs, FnCallApi, ImportImageRequest, ImportProgress, SandboxFilter, Shim } from './types';

export class LocalFnCall implements FnCallApi {
  constructor(
    private readonly fn: FnCallManager,
    private readonly node: ShimNode,
  ) {}

  async anonymousRunCode() {
    return this.fn.runCodeAnonymous;
  }
  async listPools() {
    return this.fn.listPools();
  }
  async createPool(body: unknown, principal: Principal, opts: { wait?: boolean } = {}) {
    // A pool serves every account that may invoke it: its creator must at least be allowed its
    // content. The judge image and the judge's own toolkit layers are everyone's.
    const stats = this.fn.createPool(body, 'api', (p) =>
      this.node.authorizeContent(principal, {
        image: p.image === JUDGE_IMAGE && !this.node.listImages().some((i) => i.name === JUDGE_IMAGE) ? undefined : p.image,
        toolkits: p.layers.filter((l) => TOOLKITS[l] === undefined),
      }),
    );
    if (opts.wait !== true) return stats;
    await this.fn.waitWarm(stats.name);
    return this.fn.pool(stats.name).stats();
  }
  async poolStats(name: string) {
    return this.fn.pool(name).stats();
  }
  deletePool(name: string) {
    return this.fn.deletePool(name);
  }
  async invoke(pool: string, account: string, req: Parameters<FnCallApi['invoke']>[2]) {
    this.fn.checkLimits(pool, req);
    return this.fn.invoke(pool, account, req);
  }
  async judge(pool: string, account: string, req: Parameters<FnCallApi['judge']>[2]) {
    this.fn.checkLimits(pool, req);
    return this.fn.judge(pool, account, req);
  }
  async batch(pool: string, account: string, reqs: Parameters<FnCallApi['batch']>[2], concurrency?: number) {
    for (const r of reqs) this.fn.checkLimits(pool, r);
    return this.fn.batch(pool, account, reqs, concurrency);
  }
  async runCode(account: string, req: Parameters<FnCallApi['runCode']>[1]) {
    const pool = this.fn.runCodePool(req.language);
    const body = fitToPolicy(req, this.fn.pool(pool).spec.limits);
    this.fn.checkLimits(pool, body);
    return this.fn.invoke(pool, account, body);
  }
  runJupyter(account: string, req: Parameters<FnCallApi['runJupyter']>[1]) {
    return this.fn.runJupyter(this.fn.runCodePool('python3'), account, req);
  }
  async languages() {
    return this.fn.languages();
  }
  async ensureToolkit(name: string) {
    if (TOOLKITS[name] === undefined) throw new WarrenError('NOT_FOUND', `no toolkit ${JSON.stringify(name).slice(0, 40)}`);
    await this.fn.ensureToolkit(name);
  }
}

export class LocalShim implements Shim {
  readonly nodeId: string;
  readonly functions?: FnCallApi;

  constructor(readonly node: ShimNode) {
    this.nodeId = node.nodeId;
    if (node.functions !== undefined) this.functions = new LocalFnCall(node.functions, node);
  }

  async features() {
    return this.node.features();
  }
  createSandbox(spec: Parameters<Shim['createSandbox']>[0], principal?: Principal) {
    return this.node.createSandbox(spec, principal);
  }
  async getSandbox(id: string) {
    return this.node.getSandbox(id);
  }
  async listSandboxes(filter?: SandboxFilter) {
    return this.node.listSandboxes(filter);
  }
  async listSandboxesPage(filter: SandboxFilter, page: { limit: number; after?: string }) {
    return this.node.listSandboxesPage(filter, page);
  }
  async sandboxUsage(owner: string) {
    return this.node.sandboxUsage(owner);
  }
  deleteSandbox(id: string) {
    return this.node.deleteSandbox(id);
  }
  exec(id: string, req: Parameters<Shim['exec']>[1]) {
    return this.node.exec(id, req);
  }
  execCaptured(id: string, req: Parameters<Shim['execCaptured']>[1]) {
    return this.node.execCaptured(id, req);
  }
  execLive(id: string, req: Parameters<Shim['execLive']>[1]) {
    return this.node.execLive(id, req);
  }
  execStream(id: string, req: Parameters<Shim['execStream']>[1]) {
    return this.node.execStream(id, req);
  }
  async supervisedReason(id: string) {
    return this.node.supervisedReason(id);
  }
  execSupervised(id: string, req: Parameters<Shim['execSupervised']>[1], runId: string) {
    return this.node.execSupervised(id, req, runId);
  }
  async followSupervised(id: string, runId: string) {
    return this.node.followSupervised(id, runId);
  }
  dropSupervised(id: string, runId: string) {
    return this.node.dropSupervised(id, runId);
  }
  sweepSupervised(id: string, keep: ReadonlySet<string>) {
    return this.node.sweepSupervised(id, keep);
  }
  readFile(id: string, path: string, maxBytes: number) {
    return this.node.readFile(id, path, maxBytes);
  }
  writeFile(id: string, path: string, data: Buffer, mode?: number) {
    return this.node.writeFile(id, path, data, mode);
  }
  listDir(id: string, path: string) {
    return this.node.listDir(id, path);
  }
  watchDir(id: string, path: string, opts: { recursive: boolean }) {
    return this.node.watchDir(id, path, opts);
  }
  screenshot(id: string, opts?: { width?: number }) {
    return this.node.screenshot(id, opts);
  }
  sendInput(id: string, actions: unknown) {
    return this.node.sendInput(id, actions);
  }
  openVnc(id: string) {
    return this.node.openVnc(id);
  }
  uploadTar(id: string, dir: string, tar: Buffer) {
    return this.node.uploadTar(id, dir, tar);
  }
  downloadTar(id: string, path: string) {
    return this.node.downloadTar(id, path);
  }
  openSession(id: string, opts: Parameters<Shim['openSession']>[1]) {
    return this.node.openSession(id, opts);
  }
  attachSession(id: string, sessionId: string, fromOffset: number) {
    return this.node.attachSession(id, sessionId, fromOffset);
  }
  listSessions(id: string) {
    return this.node.listSessions(id);
  }
  pauseSandbox(id: string) {
    return this.node.pauseSandbox(id);
  }
  resumeSandbox(id: string) {
    return this.node.resumeSandbox(id);
  }
  pauseSandboxes(filter: Parameters<Shim['pauseSandboxes']>[0]) {
    return this.node.pauseSandboxes(filter);
  }
  resumeSandboxes(filter: Parameters<Shim['resumeSandboxes']>[0]) {
    return this.node.resumeSandboxes(filter);
  }
  hibernateSandbox(id: string) {
    return this.node.hibernateSandbox(id);
  }
  async extendSandbox(id: string, req: { seconds?: number; ttlSeconds?: number }) {
    return this.node.extendSandbox(id, req);
  }
  packSandbox(id: string, req: Parameters<Shim['packSandbox']>[1], owner: string) {
    return this.node.packSandbox(id, req, owner);
  }
  async environment(ref: string, principal?: Principal) {
    return this.node.environment(ref, principal);
  }
  async listEnvironments(principal?: Principal) {
    return this.node.listEnvironments(principal);
  }
  async authorizeContent(principal: Principal, refs: ContentRefs) {
    this.node.authorizeContent(principal, refs);
  }
  async publishEnvironment(name: string, published: boolean) {
    return this.node.publishEnvironment(name, published);
  }
  updateNetwork(id: string, change: Record<string, boolean>) {
    return this.node.updateNetwork(id, change);
  }
  async networkInfo(id: string) {
    return this.node.networkInfo(id);
  }
  sandboxStats(id: string) {
    return this.node.sandboxStats(id);
  }
  async listImages(principal?: Principal) {
    return this.node.listImages(principal);
  }
  importImage(req: ImportImageRequest, onProgress?: (p: ImportProgress) => void) {
    return this.node.importImage(req, onProgress);
  }
  pushImage(req: { image: string; ref: string }, onProgress?: (p: ImportProgress) => void) {
    return this.node.pushImage(req, onProgress);
  }
  stageImage(req: { image: string; repository: string }, onProgress?: (p: ImportProgress) => void) {
    return this.node.stageImage(req, onProgress);
  }
  removeImage(name: string) {
    return this.node.removeImage(name);
  }
  async layerStates(digests?: string[]) {
    return this.node.layerStates(digests);
  }
  /** Closes the node too: the binding owns it. */
  close() {
    return this.node.close();
  }
}
