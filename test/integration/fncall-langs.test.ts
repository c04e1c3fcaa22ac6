/**
 * Every language of the default toolkits, through the real node and gateway:
 * hello world, stdin, a runtime error, a compile error (compiled languages), a
 * timeout and a memory-limit case, each reaching its exact status; the
 * test-runner modes (pytest, junit, jest, go_test, D_ut) report failing tests.
 *
 * One pool carries every default toolkit (built once per machine from Debian's
 * packages and then taken from the node cache), and the cases run concurrently.
 * The lazy toolkits (kotlin, racket) are built only with WARREN_TEST_LAZY_LANGS=1
 * (kotlin_script has its own file, fncall-kotlin.test.ts).
 */
import test from 'ava';
import type { InvokeResult } from '../../src/shim/fncall/types';
import { TOOLKITS } from '../../src/shim/fncall/toolkits';
import { type FnFixture, integrationSkipReason, openFnFixture } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
const lazy = process.env.WARREN_TEST_LAZY_LANGS === '1';
let f: FnFixture;
const maybe = testUnless(skip);
const POOL = 'langs';

interface Case {
  hello: string;
  /** Echo one line of stdin back, prefixed with "got ". */
  stdin: string;
  runtimeError: string;
  compileError?: string;
  loop: string;
  /** Allocate (and touch) far more than 128 MB. */
  memory: string;
  /** The status the memory case reaches: the kernel's OOM kill, or the runtime's own heap limit (JVM, PHP, ...). */
  memoryStatus: 'memory_limit' | 'runtime_error';
  timeoutMs?: number;
}

const CASES: Record<string, Case> = {
  python3: {
    hello: 'print("hello")',
    stdin: 'print("got " + input())',
    runtimeError: 'raise SystemExit(3)',
    loop: 'while True: pass',
    memory: 'a = b"x" * (600 << 20)\nprint(len(a))',
    memoryStatus: 'memory_limit',
  },
  java: {
    hello: 'public class Main { public static void main(String[] a) { System.out.println("hello"); } }',
    stdin: 'import java.util.*; public class Main { public static void main(String[] a) { System.out.println("got " + new Scanner(System.in).nextLine()); } }',
    runtimeError: 'public class Main { public static void main(String[] a) { System.exit(3); } }',
    compileError: 'public class Main { public static void main(String[] a) { int x = "s"; } }',
    loop: 'public class Main { public static void main(String[] a) { while (true) {} } }',
    memory: 'public class Main { public static void main(String[] a) { long[] x = new long[400_000_000]; System.out.println(x.length); } }',
    memoryStatus: 'runtime_error',
  },
  scala: {
    hello: 'object Main { def main(a: Array[String]): Unit = println("hello") }',
    stdin: 'object Main { def main(a: Array[String]): Unit = println("got " + scala.io.StdIn.readLine()) }',
    runtimeError: 'object Main { def main(a: Array[String]): Unit = sys.exit(3) }',
    compileError: 'object Main { def main(a: Array[String]): Unit = { val x: Int = "s" } }',
    loop: 'object Main { def main(a: Array[String]): Unit = while (true) {} }',
    memory: 'object Main { def main(a: Array[String]): Unit = println(new Array[Long](400000000).length) }',
    memoryStatus: 'runtime_error',
    timeoutMs: 8000,
  },
  nodejs: {
    hello: 'console.log("hello")',
    stdin: 'const l = require("fs").readFileSync(0, "utf8").split("\\n")[0]; console.log("got " + l)',
    runtimeError: 'process.exit(3)',
    loop: 'for (;;) {}',
    memory: 'const b = Buffer.alloc(600 << 20, 1); console.log(b.length)',
    memoryStatus: 'memory_limit',
  },
  typescript: {
    hello: 'const s: string = "hello"; console.log(s)',
    stdin: 'declare const require: any; const l: string = require("fs").readFileSync(0, "utf8").split("\\n")[0]; console.log("got " + l)',
    runtimeError: 'declare const process: any; process.exit(3)',
    compileError: 'const x = ;',
    loop: 'for (;;) {}',
    memory: 'declare const Buffer: any; const b = Buffer.alloc(600 << 20, 1); console.log(b.length)',
    memoryStatus: 'memory_limit',
  },
  go: {
    hello: 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }',
    stdin: 'package main\nimport ("bufio"; "fmt"; "os")\nfunc main() { s := bufio.NewScanner(os.Stdin); s.Scan(); fmt.Println("got " + s.Text()) }',
    runtimeError: 'package main\nimport "os"\nfunc main() { os.Exit(3) }',
    compileError: 'package main\nfunc main() { var x int = "s" }',
    loop: 'package main\nfunc main() { for {} }',
    memory: 'package main\nimport "fmt"\nfunc main() { b := make([]byte, 600<<20); for i := range b { b[i] = 1 }; fmt.Println(len(b)) }',
    memoryStatus: 'memory_limit',
  },
  rust: {
    hello: 'fn main() { println!("hello"); }',
    stdin: 'fn main() { let mut s = String::new(); std::io::stdin().read_line(&mut s).unwrap(); println!("got {}", s.trim_end()); }',
    runtimeError: 'fn main() { std::process::exit(3); }',
    compileError: 'fn main() { let x: i32 = "s"; }',
    loop: 'fn main() { loop {} }',
    memory: 'fn main() { let v = vec![1u8; 600 << 20]; println!("{}", v.len()); }',
    memoryStatus: 'memory_limit',
  },
  php: {
    hello: '<?php echo "hello\\n";',
    stdin: '<?php echo "got " . trim(fgets(STDIN)) . "\\n";',
    runtimeError: '<?php exit(3);',
    loop: '<?php while (true) {}',
    memory: '<?php $s = str_repeat("x", 600 << 20); echo strlen($s), "\\n";',
    memoryStatus: 'memory_limit',
  },
  ruby: {
    hello: 'puts "hello"',
    stdin: 'puts "got " + gets.chomp',
    runtimeError: 'exit 3',
    loop: 'loop {}',
    memory: 's = "x" * (600 << 20); puts s.size',
    memoryStatus: 'memory_limit',
  },
  perl: {
    hello: 'print "hello\\n";',
    stdin: 'my $l = <STDIN>; chomp $l; print "got $l\\n";',
    runtimeError: 'exit 3;',
    loop: '1 while 1;',
    memory: 'my $s = "x" x (600 << 20); print length($s), "\\n";',
    memoryStatus: 'memory_limit',
  },
  lua: {
    hello: 'print("hello")',
    stdin: 'print("got " .. io.read("l"))',
    runtimeError: 'os.exit(3)',
    loop: 'while true do end',
    memory: 'local s = string.rep("x", 600 * 1024 * 1024) print(#s)',
    memoryStatus: 'memory_limit',
  },
  R: {
    hello: 'cat("hello\\n")',
    stdin: 'l <- readLines(file("stdin"), n = 1); cat("got ", l, "\\n", sep = "")',
    runtimeError: 'quit(status = 3)',
    loop: 'while (TRUE) {}',
    memory: 'x <- rep(1.5, 80e6); cat(length(x), "\\n")',
    memoryStatus: 'memory_limit',
  },
  csharp: {
    hello: 'class P { static void Main() { System.Console.WriteLine("hello"); } }',
    stdin: 'class P { static void Main() { System.Console.WriteLine("got " + System.Console.ReadLine()); } }',
    runtimeError: 'class P { static int Main() { return 3; } }',
    compileError: 'class P { static void Main() { int x = "s"; } }',
    loop: 'class P { static void Main() { while (true) {} } }',
    memory: 'class P { static void Main() { var b = new byte[600 << 20]; for (int i = 0; i < b.Length; i += 4096) b[i] = 1; System.Console.WriteLine(b.Length); } }',
    memoryStatus: 'memory_limit',
  },
  d: {
    hello: 'import std.stdio; void main() { writeln("hello"); }',
    stdin: 'import std.stdio, std.string; void main() { writeln("got " ~ readln().chomp); }',
    runtimeError: 'import core.stdc.stdlib; void main() { exit(3); }',
    compileError: 'void main() { int x = "s"; }',
    loop: 'void main() { while (true) {} }',
    memory: 'import std.stdio; void main() { auto b = new ubyte[600 << 20]; b[] = 1; writeln(b.length); }',
    memoryStatus: 'memory_limit',
  },
  verilog: {
    hello: 'module main; initial begin $display("hello"); $finish; end endmodule',
    stdin: 'module main; reg [8*64-1:0] s; integer r; initial begin r = $fgets(s, 32\'h8000_0000); $display("got %0s", s[8*64-1:8]); $finish; end endmodule',
    runtimeError: 'module main; initial begin $fatal(1, "boom"); end endmodule',
    compileError: 'module main; initial begin x = ; end endmodule',
    loop: 'module main; reg c; initial c = 0; always #1 c = ~c; endmodule',
    memory: 'module main; reg [7:0] m [0:700000000]; initial begin m[700000000] = 1; $display("%d", m[700000000]); $finish; end endmodule',
    memoryStatus: 'memory_limit',
  },
};

/** Languages of the lazy toolkits: their tests run only with WARREN_TEST_LAZY_LANGS=1. */
const LAZY_CASES: Record<string, Case> = {
  racket: {
    hello: '#lang racket\n(displayln "hello")',
    stdin: '#lang racket\n(displayln (string-append "got " (read-line)))',
    runtimeError: '#lang racket\n(exit 3)',
    loop: '#lang racket\n(let loop () (loop))',
    memory: '#lang racket\n(define v (make-bytes (* 600 1024 1024) 1))\n(displayln (bytes-length v))',
    memoryStatus: 'memory_limit',
    timeoutMs: 20_000,
  },
};

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  const layers = Object.values(TOOLKITS)
    .filter((t) => t.name !== 'python' && t.name !== 'kotlin' && (lazy || !t.lazy))
    .map((t) => t.name);
  await f.pool({ name: POOL, layers, min: 2, max: 4, limits: { memoryMb: 256, pids: 128, timeoutMs: 60_000, maxTimeoutMs: 120_000 } });
});

test.after.always(async () => {
  if (f) await f.close();
});

// At most 8 invocations in flight from this file (the pool runs 4 at a time, the rest wait in its queue).
let inFlight = 0;
const waiting: Array<() => void> = [];
async function inv(language: string, code: string, extra: Record<string, unknown> = {}): Promise<InvokeResult> {
  if (inFlight >= 8) await new Promise<void>((r) => waiting.push(r));
  inFlight++;
  try {
    return await f.admin.functions.invoke(POOL, { code, language, compileTimeoutMs: 120_000, ...extra });
  } finally {
    inFlight--;
    waiting.shift()?.();
  }
}

const why = (r: InvokeResult) => JSON.stringify({ status: r.status, phase: r.phase, exitCode: r.exitCode, signal: r.signal, stdout: r.stdout.slice(0, 300), stderr: r.stderr.slice(0, 600), compile: r.compile && { status: r.compile.status, stderr: r.compile.stderr.slice(0, 600) } });

for (const [lang, c] of [...Object.entries(CASES), ...Object.entries(LAZY_CASES)]) {
  const register = lang in LAZY_CASES && !lazy ? testUnless(skip ?? 'a lazy toolkit (built only on demand): set WARREN_TEST_LAZY_LANGS=1') : maybe;
  register(`${lang}: hello, stdin, runtime error, compile error, timeout, memory limit`, async (t) => {
    const timeoutMs = c.timeoutMs ?? 3000;
    const [hello, stdin, rt, ce, loop, mem] = await Promise.all([
      inv(lang, c.hello),
      inv(lang, c.stdin, { stdin: 'line one\nline two\n' }),
      inv(lang, c.runtimeError),
      c.compileError !== undefined ? inv(lang, c.compileError) : Promise.resolve(null),
      inv(lang, c.loop, { timeoutMs }),
      inv(lang, c.memory, { memoryMb: 128 }),
    ]);
    t.is(hello.status, 'ok', why(hello));
    t.is(hello.stdout.trim(), 'hello', why(hello));
    t.is(stdin.status, 'ok', why(stdin));
    t.is(stdin.stdout.trim(), 'got line one', why(stdin));
    t.is(rt.phase, 'run', why(rt));
    t.is(rt.status, 'runtime_error', why(rt));
    t.not(rt.exitCode, 0, why(rt));
    if (ce !== null) {
      t.is(ce.phase, 'compile', why(ce));
      t.is(ce.status, 'runtime_error', why(ce));
    }
    t.is(loop.status, 'timeout', why(loop));
    t.is(mem.status, c.memoryStatus, why(mem));
  });
}

const RUNNERS: Array<{ lang: string; pass: string; fail: string; failMark: RegExp }> = [
  {
    lang: 'pytest',
    pass: 'def test_ok():\n    assert 1 + 1 == 2\n',
    fail: 'def test_ok():\n    assert True\n\ndef test_bad():\n    assert 1 + 1 == 3\n',
    failMark: /1 failed, 1 passed/,
  },
  {
    lang: 'junit',
    pass: 'import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\npublic class MainTest { @Test void ok() { assertEquals(2, 1 + 1); } }',
    fail: 'import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\npublic class MainTest { @Test void ok() { assertEquals(2, 1 + 1); } @Test void bad() { assertEquals(3, 1 + 1); } }',
    failMark: /1 tests failed/,
  },
  {
    lang: 'jest',
    pass: 'test("ok", () => { expect(1 + 1).toBe(2); });',
    fail: 'test("ok", () => { expect(1 + 1).toBe(2); });\ntest("bad", () => { expect(1 + 1).toBe(3); });',
    failMark: /1 failed, 1 passed/,
  },
  {
    lang: 'go_test',
    pass: 'package main\nimport "testing"\nfunc TestOk(t *testing.T) { if 1+1 != 2 { t.Fatal("no") } }',
    fail: 'package main\nimport "testing"\nfunc TestOk(t *testing.T) {}\nfunc TestBad(t *testing.T) { t.Fatal("1+1 is not 3") }',
    failMark: /--- FAIL: TestBad/,
  },
  {
    lang: 'D_ut',
    pass: 'unittest { assert(1 + 1 == 2); }',
    fail: 'unittest { assert(1 + 1 == 2); }\nunittest { assert(1 + 1 == 3, "1+1 is not 3"); }',
    failMark: /1 is not 3|unittest failure|failed/,
  },
];

for (const r of RUNNERS) {
  maybe(`${r.lang}: passing tests succeed, failing tests are reported`, async (t) => {
    const [ok, bad] = await Promise.all([inv(r.lang, r.pass), inv(r.lang, r.fail)]);
    t.is(ok.status, 'ok', why(ok));
    t.is(bad.status, 'runtime_error', why(bad));
    t.regex(bad.stdout + bad.stderr, r.failMark, why(bad));
  });
}

maybe('a pool says which languages it carries; one without a toolkit refuses its languages with the list', async (t) => {
  const p = await f.admin.functions.get(POOL);
  for (const l of Object.keys(CASES)) t.true(p.languages.includes(l), l);
  await f.pool({ name: 'plain', min: 0, max: 1 });
  const plain = await f.admin.functions.get('plain');
  t.true(plain.languages.includes('python3') && plain.languages.includes('pytest'));
  t.false(plain.languages.includes('java'));
  const err = await t.throwsAsync(f.admin.functions.invoke('plain', { code: 'x', language: 'java' }));
  t.regex(err!.message, /does not carry language java.*it carries: .*python3/);
  t.regex(err!.message, /pools that do: langs/);
  await f.admin.functions.delete('plain');
});

maybe('languages endpoint: available with toolkit and pools, unavailable with the reason; unknown and unavailable names list the available ones', async (t) => {
  const info = await f.admin.functions.languages();
  const java = info.available.find((l) => l.name === 'java')!;
  t.is(java.toolkit, 'java');
  t.true(java.compiled);
  t.true(java.pools.includes(POOL));
  t.true(info.available.find((l) => l.name === 'pytest')!.testRunner);
  for (const n of ['julia', 'swift', 'lean', 'cuda']) t.truthy(info.unavailable.find((u) => u.name === n)?.reason, n);
  const unknown = await t.throwsAsync(f.admin.functions.invoke(POOL, { code: 'x', language: 'cobol' }));
  t.regex(unknown!.message, /unknown language "cobol" \(available: .*java.*rust/);
  const julia = await t.throwsAsync(f.admin.functions.invoke(POOL, { code: 'x', language: 'julia' }));
  t.regex(julia!.message, /julia is not available on this node: Julia is not packaged by Debian 12/);
});

maybe('bad input: a compile bomb stops at the compile limit, a JVM starting threads stops at pids, a flood is truncated; the pool survives', async (t) => {
  const bomb = await inv('cpp', 'template<int N> struct F { enum { v = F<N-1>::v + F<N-2>::v }; };\ntemplate<> struct F<0> { enum { v = 0 }; };\ntemplate<> struct F<1> { enum { v = 1 }; };\n#define A(x) x x x x x x x x\nint main() { return F<100000>::v; }', { compileTimeoutMs: 3000 });
  t.is(bomb.phase, 'compile', why(bomb));
  t.not(bomb.status, 'ok', why(bomb));
  const threads = await inv(
    'java',
    'public class Main { public static void main(String[] a) throws Exception { for (int i = 0; ; i++) { Thread t = new Thread(() -> { try { Thread.sleep(100000); } catch (Exception e) {} }); t.setDaemon(true); t.start(); } } }',
    { timeoutMs: 15_000 },
  );
  t.is(threads.status, 'runtime_error', why(threads));
  t.regex(threads.stderr, /OutOfMemoryError: unable to create native thread|Cannot allocate memory|pthread_create failed/, why(threads));
  // A writer that waits for the pipe (a tight loop that never yields would only buffer its way
  // into the memory limit inside node, never reaching the pipe): the output limit cuts it off.
  const flood = await inv('nodejs', 'const s = "y".repeat(1 << 16); const w = () => { while (process.stdout.write(s)); process.stdout.once("drain", w); }; w();', { maxOutputBytes: 100_000 });
  t.is(flood.status, 'output_limit', why(flood));
  t.true(flood.truncated);
  t.is(flood.stdout.length, 100_000);
  // The tight loop: whichever limit it reaches first, the answer never carries more than the limit.
  const tight = await inv('nodejs', 'const s = "y".repeat(1 << 16); for (;;) process.stdout.write(s)', { maxOutputBytes: 100_000 });
  t.true(['output_limit', 'memory_limit'].includes(tight.status), why(tight));
  t.true(tight.stdout.length <= 100_000);
  const after = await inv('go', CASES.go!.hello);
  t.is(after.stdout, 'hello\n', why(after));
});
