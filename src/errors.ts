/**
 * One error hierarchy for all of Warren. Every error carries a stable string
 * `code` (part of the public contract: clients switch on it) and the HTTP
 * status the gateway answers with. The native addon constructs this same class
 * (it is handed over at load time), so errors from C++ look exactly like errors
 * thrown in TypeScript.
 */

const kWarrenError = Symbol.for('warren.error');

/** Stable error codes. Add new ones at the end of a group; never rename. */
export const ErrorCodes = {
  // 400: the request is wrong
  INVALID_ARGUMENT: 400,
  UNKNOWN_FIELD: 400,
  INVALID_ID: 400,
  PATH_ESCAPE: 400,
  ARCHIVE_ESCAPE: 400,
  INVALID_ARCHIVE: 400,
  LIMIT_OUT_OF_RANGE: 400,
  /** A security policy file is malformed, half-written, symlinked or contradictory. */
  POLICY_INVALID: 400,
  /** A computer-use input action names a point outside the screen. */
  OFF_SCREEN: 400,
  /** A computer-use input action names a key (or types a character) the VM's keyboard does not have. */
  UNKNOWN_KEY: 400,
  // 401/403: who you are and what you may do
  UNAUTHENTICATED: 401,
  FORBIDDEN: 403,
  ORIGIN_REFUSED: 403,
  /** The sandbox's own permissions refuse it (a file its user may not write, a read-only mount). */
  PERMISSION_DENIED: 403,
  // 404: no such thing
  NOT_FOUND: 404,
  SANDBOX_NOT_FOUND: 404,
  SESSION_NOT_FOUND: 404,
  IMAGE_NOT_FOUND: 404,
  LAYER_NOT_FOUND: 404,
  FILE_NOT_FOUND: 404,
  JOB_NOT_FOUND: 404,
  // 409: the state does not allow it
  SANDBOX_NOT_RUNNING: 409,
  ALREADY_EXISTS: 409,
  IMAGE_IN_USE: 409,
  SESSION_BUSY: 409,
  /** A request with this idempotency key is still running and cannot be attached to from here. */
  IDEMPOTENCY_IN_PROGRESS: 409,
  /** The first run under this idempotency key was cut by a gateway restart; its outcome is unknown and it is not run again. */
  IDEMPOTENCY_INTERRUPTED: 409,
  /** A cluster node holds its lease: what the cluster keeps of a lost node cannot be forgotten while it is back. */
  NODE_LIVE: 409,
  // 410: it was there and is gone for good
  /** The sandbox's node lost its cluster lease: the sandbox is gone with it (its owner and job were told). */
  SANDBOX_LOST: 410,
  // 422: the request contradicts an earlier one
  /** An idempotency key sent again with a different request body. */
  IDEMPOTENCY_KEY_REUSED: 422,
  // 413/429: too much
  PAYLOAD_TOO_LARGE: 413,
  RESOURCE_EXHAUSTED: 429,
  /** An account quota (concurrent sandboxes, cpu, memory) would be exceeded. */
  QUOTA_EXCEEDED: 429,
  // 507: no room
  /** No space left: the sandbox's disk quota (diskMb), or the node's disk. */
  DISK_FULL: 507,
  // 501: this node or kernel cannot
  NOT_SUPPORTED: 501,
  /** No confinement enforcer (AppArmor, Landlock) and seccomp here, and unconfined sandboxes are not allowed. */
  CONFINEMENT_UNAVAILABLE: 501,
  // 5xx: ours
  INTERNAL: 500,
  NATIVE_ERROR: 500,
  CGROUP_ERROR: 500,
  MOUNT_ERROR: 500,
  SPAWN_ERROR: 500,
  IMAGE_BUILD_FAILED: 500,
  TIMEOUT: 504,
  UNAVAILABLE: 503,
  /**
   * The node is out of a host resource (details.resource: fds, pids, namespaces, memory,
   * cgroups): nothing new can start here until sandboxes end; everything else keeps working.
   */
  NODE_AT_CAPACITY: 503,
  /** An OCI registry refused a request, answered nonsense, or could not be reached. */
  REGISTRY_ERROR: 502,
  /** Bytes from a registry do not match their digest (a corrupt blob or chunk): nothing of them is used. */
  LAYER_CORRUPT: 502,
  /** The cluster store (etcd) has no quorum or cannot be reached: nothing new is placed. */
  CLUSTER_UNAVAILABLE: 503,
  /** The node lost its cluster lease and admits nothing until it has re-registered. */
  NODE_FENCED: 503,
} as const;

export type ErrorCode = keyof typeof ErrorCodes;

export interface WarrenErrorJson {
  error: { code: ErrorCode; message: string; details?: Record<string, unknown> };
}

export class WarrenError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly details: Record<string, unknown> | undefined;
  /** errno from the kernel when the error came from a syscall in the native helper. */
  readonly errno: number | undefined;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>, errno?: number) {
    super(message);
    if (typeof code !== 'string' || !Object.hasOwn(ErrorCodes, code)) {
      // A bad code is a programming error; keep the message, mark it internal.
      code = 'INTERNAL';
    }
    this.name = 'WarrenError';
    this.code = code;
    this.status = ErrorCodes[code];
    this.details = details;
    this.errno = errno;
  }

  static override [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[kWarrenError] === true;
  }

  get [kWarrenError](): true {
    return true;
  }

  toJSON(): WarrenErrorJson {
    const body: WarrenErrorJson['error'] = { code: this.code, message: this.message };
    if (this.details !== undefined) body.details = this.details;
    return { error: body };
  }
}

/**
 * errno classes that mean the same thing wherever they come from: a full
 * disk is a full disk, whether Node's fs, the native addon or a tool inside
 * the sandbox hit it. Everything errno-based goes through this table (Node
 * system errors carry the name in `code`, native WarrenErrors the number in
 * `errno`, tools print strerror text).
 */
const ERRNO_CLASSES: ReadonlyArray<{ names: readonly string[]; numbers: readonly number[]; text: RegExp; code: ErrorCode; say: string; resource?: string }> = [
  {
    names: ['ENOSPC', 'EDQUOT'],
    numbers: [28, 122],
    text: /No space left on device|Disk quota exceeded/i,
    code: 'DISK_FULL',
    say: "no space left: the sandbox's disk quota (diskMb) or the node's disk is full",
  },
  { names: ['EFBIG'], numbers: [27], text: /File too large/i, code: 'PAYLOAD_TOO_LARGE', say: 'file too large for the file system' },
  { names: ['EROFS'], numbers: [30], text: /Read-only file system/i, code: 'PERMISSION_DENIED', say: 'read-only file system' },
  { names: ['EMFILE', 'ENFILE'], numbers: [24, 23], text: /Too many open files/i, code: 'NODE_AT_CAPACITY', say: 'the node is out of file descriptors; retry later', resource: 'fds' },
  { names: ['ENOMEM'], numbers: [12], text: /Cannot allocate memory/i, code: 'NODE_AT_CAPACITY', say: 'the node is out of memory; retry later', resource: 'memory' },
];

/** Codes that say "the platform failed"; an errno of a user class under one of them is remapped. */
const OURS = new Set<ErrorCode>(['INTERNAL', 'NATIVE_ERROR', 'CGROUP_ERROR', 'MOUNT_ERROR', 'SPAWN_ERROR']);

/** The stable error for an errno (name like "ENOSPC" or number), or null when its class has none. */
export function errnoError(errno: string | number, context: string): WarrenError | null {
  const cls = ERRNO_CLASSES.find((c) => (typeof errno === 'number' ? c.numbers.includes(errno) : c.names.includes(errno)));
  if (!cls) return null;
  const name = typeof errno === 'number' ? cls.names[cls.numbers.indexOf(errno)]! : errno;
  return new WarrenError(cls.code, `${cls.say} (${context}: ${name})`, cls.resource === undefined ? { errno: name } : { errno: name, resource: cls.resource });
}

/** The stable error for a tool's strerror text (e.g. tar's stderr), or null. */
export function errorFromToolOutput(text: string, context: string): WarrenError | null {
  const cls = ERRNO_CLASSES.find((c) => c.text.test(text));
  if (!cls) return null;
  const details: Record<string, unknown> = { errno: cls.names[0] };
  if (cls.resource !== undefined) details.resource = cls.resource;
  return new WarrenError(cls.code, `${cls.say} (${context}: ${text.trim().slice(0, 300)})`, details);
}

/**
 * Wrap anything thrown into a WarrenError. WarrenErrors stay as they are,
 * except platform codes carrying the errno of a user class (ENOSPC under
 * NATIVE_ERROR is a full disk); Node system errors of a known class get its
 * code; anything else is INTERNAL.
 */
export function asWarrenError(err: unknown): WarrenError {
  if (err instanceof WarrenError) {
    if (err.errno !== undefined && OURS.has(err.code)) return errnoError(err.errno, err.message) ?? err;
    return err;
  }
  const sys = err as NodeJS.ErrnoException | null;
  if (sys && typeof sys === 'object' && typeof sys.code === 'string' && /^E[A-Z0-9]+$/.test(sys.code)) {
    const mapped = errnoError(sys.code, sys.syscall ?? 'system call');
    if (mapped) return mapped;
  }
  const message = err instanceof Error ? err.message : String(err);
  return new WarrenError('INTERNAL', message);
}

export function notSupported(feature: string, reason: string): WarrenError {
  return new WarrenError('NOT_SUPPORTED', `${feature} is not supported on this node: ${reason}`, { feature, reason });
}
