/**
 * Languages FnCall knows: where the source goes, how it is compiled (with its
 * own limits), how it runs, and which toolkit layer carries its toolchain.
 *
 * Toolchains are layers: the judge image (Debian minbase + python3, gcc, g++)
 * at the bottom, the `python` toolkit (Python's scientific and testing packages)
 * over it in every judge pool, and one toolkit per language family over that,
 * each built from Debian's packages and cached on the node (toolkits.ts). A
 * pool carries the languages of the layers it stacks.
 *
 * Argument templates: `{class}` is the class named by the source (Java, JUnit),
 * `{memoryMb}` the invocation's memory limit (JVM heap sizing).
 */
import type { Language } from './types';
import { lookupTable } from '../../validation';

export interface LanguageDef {
  name: Language;
  /** Toolkit layer that carries the toolchain; null: the judge image itself. */
  toolkit: string | null;
  source: string;
  compile?: string[];
  run: string[];
  /** Extra environment of the compile and run steps. */
  env?: Record<string, string>;
  /** Source file name from the code (Java's public class must live in <Class>.java). */
  sourceFor?: (code: string) => { source: string; vars: Record<string, string> };
  /** A test-runner mode: failing tests make the run fail. */
  testRunner?: boolean;
  /** Files the toolchain needs besides the source (absolute paths in the invocation's scratch). */
  support?: Array<{ path: string; text: string }>;
  /**
   * The compile step's time limit is at least this: for a language whose request has no compile
   * step of its own (SandboxFusion runs kotlin_script as one interpreted step), the client's
   * compile_timeout was never meant for the compiler Warren runs first.
   */
  minCompileTimeoutMs?: number;
}

const JVM = ['-XX:+UseSerialGC', '-XX:-UsePerfData', '-XX:TieredStopAtLevel=1', '-XX:CICompilerCount=1', '-Xss8m', '-XX:MaxRAM={memoryMb}m', '-XX:MaxRAMPercentage=70'];
const TS_TRANSPILE = [
  "const ts = require('typescript'), fs = require('fs');",
  "const r = ts.transpileModule(fs.readFileSync('main.ts', 'utf8'), { fileName: 'main.ts', reportDiagnostics: true, compilerOptions: { target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.CommonJS } });",
  "for (const d of r.diagnostics) { const p = d.file ? d.file.getLineAndCharacterOfPosition(d.start) : { line: 0, character: 0 };",
  "  process.stderr.write(`main.ts(${p.line + 1},${p.character + 1}): error TS${d.code}: ${ts.flattenDiagnosticMessageText(d.messageText, '\\n')}\\n`); }",
  "if (r.diagnostics.length > 0) process.exit(1);",
  "fs.writeFileSync('main.js', r.outputText);",
].join('\n');
const JUNIT_JAR = '/usr/share/java/junit-platform-console-standalone.jar';

function javaClass(code: string, fallback: string): { source: string; vars: Record<string, string> } {
  const m = /\bpublic\s+(?:final\s+|abstract\s+)*(?:class|interface|enum|record)\s+([A-Za-z_$][A-Za-z0-9_$]*)/.exec(code) ?? /\bclass\s+([A-Za-z_$][A-Za-z0-9_$]*)/.exec(code);
  const cls = m?.[1] ?? fallback;
  return { source: `${cls}.java`, vars: { class: cls } };
}

/**
 * kotlin_script: `kotlinc -script` compiles and runs in one JVM, so the compiler's start-up (about
 * 3 s of CPU, far longer on a loaded machine) counted against run_timeout. The script is compiled
 * instead (kotlinc compiles a .kts into a class whose constructor runs the script), with this
 * launcher, and runs in a plain JVM; the compile has its own limit.
 */
const KOTLIN_DIR = '/tmp/.warren-kotlin';
const KOTLIN_LAUNCHER = [
  'object WarrenScript {',
  '  @JvmStatic fun main(args: Array<String>) {',
  '    try { Class.forName("Main").getConstructor(Array<String>::class.java).newInstance(args as Any) }',
  '    catch (e: java.lang.reflect.InvocationTargetException) { throw e.cause ?: e }',
  '  }',
  '}',
  '',
].join('\n');
const KOTLIN_CP = `${KOTLIN_DIR}/out:/usr/share/java/kotlin-stdlib.jar:/usr/share/java/kotlin-script-runtime.jar`;

const GO_ENV = { GOCACHE: '/tmp/go-cache', GOPATH: '/tmp/go', GO111MODULE: 'off', GOFLAGS: '-buildvcs=false', CGO_ENABLED: '0' };

export const LANGUAGES: Record<Language, LanguageDef> = lookupTable({
  python3: { name: 'python3', toolkit: null, source: 'main.py', run: ['python3', '-B', 'main.py'] },
  pytest: { name: 'pytest', toolkit: 'python', source: 'test_main.py', run: ['python3', '-B', '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'test_main.py'], testRunner: true },
  bash: { name: 'bash', toolkit: null, source: 'main.sh', run: ['bash', 'main.sh'] },
  c: { name: 'c', toolkit: null, source: 'main.c', compile: ['gcc', '-O2', '-std=gnu17', '-pipe', '-o', 'main', 'main.c', '-lm'], run: ['./main'] },
  cpp: { name: 'cpp', toolkit: null, source: 'main.cpp', compile: ['g++', '-O2', '-std=gnu++17', '-pipe', '-o', 'main', 'main.cpp'], run: ['./main'] },
  java: {
    name: 'java',
    toolkit: 'java',
    source: 'Main.java',
    sourceFor: (code) => javaClass(code, 'Main'),
    compile: ['javac', '-J-XX:+UseSerialGC', '-J-XX:-UsePerfData', '-J-XX:TieredStopAtLevel=1', '-J-XX:MaxRAM={memoryMb}m', '-J-XX:MaxRAMPercentage=75', '-encoding', 'UTF-8', '{source}'],
    run: ['java', ...JVM, '-cp', '.', '{class}'],
  },
  junit: {
    name: 'junit',
    toolkit: 'java',
    source: 'MainTest.java',
    sourceFor: (code) => javaClass(code, 'MainTest'),
    compile: ['javac', '-J-XX:+UseSerialGC', '-J-XX:-UsePerfData', '-J-XX:TieredStopAtLevel=1', '-J-XX:MaxRAM={memoryMb}m', '-J-XX:MaxRAMPercentage=75', '-encoding', 'UTF-8', '-cp', `${JUNIT_JAR}:.`, '{source}'],
    run: ['java', ...JVM, '-jar', JUNIT_JAR, '--disable-banner', '--details=tree', '--disable-ansi-colors', '--fail-if-no-tests', '-cp', '.', '--select-class', '{class}'],
    testRunner: true,
  },
  scala: { name: 'scala', toolkit: 'scala', source: 'Main.scala', compile: ['scalac', '-J-XX:+UseSerialGC', '-J-XX:-UsePerfData', '-J-XX:TieredStopAtLevel=1', '-J-XX:MaxRAM={memoryMb}m', '-J-XX:MaxRAMPercentage=75', '-nowarn', 'Main.scala'], run: ['scala', '-J-XX:+UseSerialGC', '-J-XX:-UsePerfData', '-J-XX:TieredStopAtLevel=1', '-J-XX:MaxRAM={memoryMb}m', '-J-XX:MaxRAMPercentage=70', '-cp', '.', 'Main'] },
  kotlin_script: {
    name: 'kotlin_script',
    toolkit: 'kotlin',
    source: 'main.kts',
    support: [{ path: `${KOTLIN_DIR}/WarrenScript.kt`, text: KOTLIN_LAUNCHER }],
    compile: ['kotlinc', '-J-XX:+UseSerialGC', '-J-XX:-UsePerfData', '-J-XX:TieredStopAtLevel=1', '-J-XX:MaxRAM={memoryMb}m', '-J-XX:MaxRAMPercentage=75', '-nowarn', 'main.kts', `${KOTLIN_DIR}/WarrenScript.kt`, '-d', `${KOTLIN_DIR}/out`],
    run: ['java', ...JVM, '-cp', KOTLIN_CP, 'WarrenScript'],
    minCompileTimeoutMs: 120_000,
  },
  nodejs: { name: 'nodejs', toolkit: 'node', source: 'main.js', run: ['node', 'main.js'] },
  // Types are not checked (as with tsx, which SandboxFusion runs): TypeScript's own transpiler
  // turns main.ts into main.js, and only syntax errors fail the compile.
  typescript: { name: 'typescript', toolkit: 'node', source: 'main.ts', compile: ['node', '-e', TS_TRANSPILE], run: ['node', 'main.js'] },
  jest: { name: 'jest', toolkit: 'node', source: 'main.test.js', run: ['jest', '--ci', '--watchman=false', '--colors=false', '--rootDir=/work', '--cacheDirectory=/tmp/jest', '--config={}'], env: { NODE_PATH: '/usr/share/nodejs' }, testRunner: true },
  go: { name: 'go', toolkit: 'go', source: 'main.go', compile: ['go', 'build', '-o', 'main', 'main.go'], run: ['./main'], env: GO_ENV },
  go_test: { name: 'go_test', toolkit: 'go', source: 'main_test.go', run: ['go', 'test', '-v', 'main_test.go'], env: GO_ENV, testRunner: true },
  rust: { name: 'rust', toolkit: 'rust', source: 'main.rs', compile: ['rustc', '-O', '--edition', '2021', '-o', 'main', 'main.rs'], run: ['./main'] },
  php: { name: 'php', toolkit: 'php', source: 'main.php', run: ['php', 'main.php'] },
  ruby: { name: 'ruby', toolkit: 'ruby', source: 'main.rb', run: ['ruby', 'main.rb'] },
  perl: { name: 'perl', toolkit: 'perl', source: 'main.pl', run: ['perl', 'main.pl'] },
  lua: { name: 'lua', toolkit: 'lua', source: 'main.lua', run: ['lua5.4', 'main.lua'] },
  R: { name: 'R', toolkit: 'r', source: 'main.R', run: ['Rscript', '--vanilla', 'main.R'] },
  csharp: { name: 'csharp', toolkit: 'mono', source: 'main.cs', compile: ['mcs', '-optimize+', '-out:main.exe', 'main.cs'], run: ['mono', 'main.exe'] },
  d: { name: 'd', toolkit: 'd', source: 'main.d', compile: ['ldc2', '-O', '-of=main', 'main.d'], run: ['./main'] },
  D_ut: { name: 'D_ut', toolkit: 'd', source: 'main.d', compile: ['ldc2', '-unittest', '-main', '-of=main', 'main.d'], run: ['./main'], testRunner: true },
  racket: { name: 'racket', toolkit: 'racket', source: 'main.rkt', run: ['racket', 'main.rkt'] },
  verilog: { name: 'verilog', toolkit: 'verilog', source: 'main.v', compile: ['iverilog', '-g2012', '-o', 'main', 'main.v'], run: ['vvp', '-n', 'main'] },
});

/** Accepted spellings: Warren's names and SandboxFusion's. */
const ALIASES: Record<string, Language> = lookupTable({
  python: 'python3',
  py: 'python3',
  sh: 'bash',
  'c++': 'cpp',
  cxx: 'cpp',
  js: 'nodejs',
  javascript: 'nodejs',
  node: 'nodejs',
  ts: 'typescript',
  golang: 'go',
  rs: 'rust',
  r: 'R',
  rb: 'ruby',
  cs: 'csharp',
  kotlin: 'kotlin_script',
  dlang: 'd',
});

/**
 * SandboxFusion languages that cannot run here, and why. The languages endpoint lists them and a
 * request for one answers with the reason.
 */
export const UNAVAILABLE: Record<string, string> = {
  julia: 'Julia is not packaged by Debian 12 (bookworm) and the node builds toolchains only from Debian packages',
  swift: 'Swift is not packaged by Debian 12 (bookworm)',
  lean: 'Lean 4 is not packaged by Debian 12 (bookworm)',
  cuda: 'needs an NVIDIA GPU and the CUDA toolkit; this node has no GPU',
  python_gpu: 'needs a GPU; this node has no GPU',
};

export function languageOf(name: string): Language | null {
  if (Object.prototype.hasOwnProperty.call(LANGUAGES, name)) return name;
  return ALIASES[name] ?? null;
}

export const LANGUAGE_NAMES = Object.keys(LANGUAGES);

export function aliasesOf(lang: Language): string[] {
  return Object.entries(ALIASES)
    .filter(([, v]) => v === lang)
    .map(([k]) => k);
}

/** The argv of a step with its templates filled in. */
export function expandArgv(argv: string[], vars: Record<string, string>): string[] {
  return argv.map((a) => a.replace(/\{(\w+)\}/g, (m, k: string) => vars[k] ?? m));
}

export const DEFAULT_COMPILE_TIMEOUT_MS = 30_000;
