/**
 * `warren shell`: an interactive terminal over the pty WebSocket. The local
 * terminal goes to raw mode, window changes are sent as resize messages, and
 * the terminal is restored however the session ends. Ctrl-] detaches (the
 * session keeps running; re-attach with --session). A connection dropped for
 * back-pressure (4429) re-attaches from the last offset received.
 */
import { WarrenError } from '../errors';
import type { ShellClient, WarrenClient } from '../sdk';

const DETACH_BYTE = 0x1d; // Ctrl-]

export interface ShellCliOptions {
  mode: 'pty' | 'command';
  session?: string | undefined;
  err: (s: string) => void;
}

export async function runShell(client: WarrenClient, id: string, opts: ShellCliOptions): Promise<number> {
  const stdin = process.stdin;
  const stdout = process.stdout;
  const sandbox = client.sandbox(id);
  const tty = stdin.isTTY === true;
  const size = () => ({ cols: stdout.columns || 80, rows: stdout.rows || 24 });

  let session = opts.session;
  let offset: number | undefined;
  let shell: ShellClient | null = null;
  let detached = false;
  let restored = false;

  const restore = () => {
    if (restored) return;
    restored = true;
    if (tty) stdin.setRawMode(false);
    stdin.pause();
  };
  const onWinch = () => {
    const s = size();
    try {
      shell?.resize(s.cols, s.rows);
    } catch {
      /* closed */
    }
  };
  const onInput = (chunk: Buffer) => {
    if (tty && chunk.includes(DETACH_BYTE)) {
      detached = true;
      void shell?.detach();
      return;
    }
    if (opts.mode === 'command') {
      // Line-oriented command mode: each line runs as a command.
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.trim() === '') continue;
        shell?.run(line).then(
          (r) => opts.err(r.exitCode === 0 ? '' : `[exit ${r.exitCode}${r.timedOut ? ', timed out' : ''}]\n`),
          (e: Error) => opts.err(`warren: ${e.message}\n`),
        );
      }
      return;
    }
    try {
      shell?.write(chunk);
    } catch {
      /* closed */
    }
  };

  try {
    for (;;) {
      const s = size();
      const shellOpts: Parameters<typeof sandbox.shell>[0] = {
        mode: opts.mode,
        onOutput: (o) => {
          if (o.stream === 'stderr') process.stderr.write(o.data);
          else stdout.write(o.data);
        },
      };
      if (session !== undefined) {
        shellOpts.session = session;
        if (offset !== undefined) shellOpts.offset = offset;
      } else {
        shellOpts.cols = s.cols;
        shellOpts.rows = s.rows;
      }
      shell = await sandbox.shell(shellOpts);
      session = shell.session;
      if (offset === undefined && opts.session === undefined) opts.err(`[session ${session}; Ctrl-] detaches]\r\n`);
      if (session !== undefined && opts.session !== undefined && offset === undefined) onWinch();
      if (!restored && tty) stdin.setRawMode(true);
      stdin.on('data', onInput);
      stdin.resume();
      process.on('SIGWINCH', onWinch);
      await shell.waitClosed();
      stdin.off('data', onInput);
      process.off('SIGWINCH', onWinch);
      if (shell.closeCode === 4429 && !detached) {
        offset = shell.offset;
        continue;
      }
      break;
    }
  } finally {
    process.off('SIGWINCH', onWinch);
    stdin.off('data', onInput);
    restore();
  }
  if (detached || (shell && shell.exit === null && shell.closeCode === 1001)) {
    opts.err(`\r\n[detached; re-attach with: warren shell ${id} --session ${session}]\n`);
    return 0;
  }
  const exit = shell?.exit;
  if (!exit) {
    if (shell?.closeCode !== 1000) throw new WarrenError('UNAVAILABLE', `shell connection closed (${shell?.closeCode} ${shell?.closeReason ?? ''})`);
    return 0;
  }
  if (exit.exitCode !== null) return exit.exitCode;
  return exit.signal !== null ? 128 + exit.signal : 0;
}
