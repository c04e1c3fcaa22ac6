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
  /** A security policy file is malformed, half-written, symlinked or contradictory (issue 5). */
  POLICY_INVALID: 400,
  // 401/403: who you are and what you may do
  UNAUTHENTICATED: 401,
  FORBIDDEN: 403,
  ORIGIN_REFUSED: 403,
  // 404: no such thing
  NOT_FOUND: 404,
  SANDBOX_NOT_FOUND: 404,
  SESSION_NOT_FOUND: 404,
  IMAGE_NOT_FOUND: 404,
  LAYER_NOT_FOUND: 404,
  FILE_NOT_FOUND: 404,
  // 409: the state does not allow it
  SANDBOX_NOT_RUNNING: 409,
  ALREADY_EXISTS: 409,
  IMAGE_IN_USE: 409,
  SESSION_BUSY: 409,
  // 413/429: too much
  PAYLOAD_TOO_LARGE: 413,
  RESOURCE_EXHAUSTED: 429,
  /** An account quota (concurrent sandboxes, cpu, memory) would be exceeded. */
  QUOTA_EXCEEDED: 429,
  // 501: this node or kernel cannot
  NOT_SUPPORTED: 501,
  /** No confinement enforcer (AppArmor, Landlock) and seccomp here, and unconfined sandboxes are not allowed (issue 5). */
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
    if (typeof code !== 'string' || !(code in ErrorCodes)) {
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

/** Wrap anything thrown into a WarrenError, keeping WarrenErrors as they are. */
export function asWarrenError(err: unknown): WarrenError {
  if (err instanceof WarrenError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new WarrenError('INTERNAL', message);
}

export function notSupported(feature: string, reason: string): WarrenError {
  return new WarrenError('NOT_SUPPORTED', `${feature} is not supported on this node: ${reason}`, { feature, reason });
}
