/**
 * NDJSON framing for long-running requests (`POST /v1/images`): one JSON
 * object per line, `\n`-terminated. JSON.stringify escapes control characters,
 * so a line never contains a raw newline. A stream ends with exactly one
 * `done` or `error` line.
 *
 *   {"type":"progress","phase":"unpack","message":"...","fraction":0.4}
 *   {"type":"done","image":{...}}        (push and stage: {"type":"done","push":{...}})
 *   {"type":"error","error":{"code":"IMAGE_BUILD_FAILED","message":"..."}}
 */
import type { ImageInfo, ImagePushResult, ImportProgress } from '../shim/types';
import type { WarrenError } from '../errors';

export const NDJSON_CONTENT_TYPE = 'application/x-ndjson';

export type ProgressEvent =
  | { type: 'progress'; phase: string; message: string; fraction?: number }
  | { type: 'done'; image: ImageInfo }
  | { type: 'done'; push: ImagePushResult }
  | { type: 'error'; error: { code: string; message: string } };

export function ndjsonLine(event: ProgressEvent): string {
  return `${JSON.stringify(event)}\n`;
}

export function progressEvent(p: ImportProgress): ProgressEvent {
  const ev: ProgressEvent = { type: 'progress', phase: String(p.phase), message: String(p.message) };
  if (typeof p.fraction === 'number' && Number.isFinite(p.fraction)) ev.fraction = Math.min(1, Math.max(0, p.fraction));
  return ev;
}

export function doneEvent(image: ImageInfo): ProgressEvent {
  return { type: 'done', image };
}

export function errorEvent(err: WarrenError): ProgressEvent {
  return { type: 'error', error: { code: err.code, message: err.message } };
}
