/**
 * Languages FnCall knows: where the source goes, how it is compiled (with its
 * own limits), and how it runs. Everything runs in /work as an unprivileged
 * user; the image must provide the toolchain ("judge" does).
 */
import type { Language } from './types';

export interface LanguageDef {
  name: Language;
  source: string;
  compile?: string[];
  run: string[];
}

export const LANGUAGES: Record<Language, LanguageDef> = {
  python3: { name: 'python3', source: 'main.py', run: ['python3', '-B', 'main.py'] },
  bash: { name: 'bash', source: 'main.sh', run: ['bash', 'main.sh'] },
  c: { name: 'c', source: 'main.c', compile: ['gcc', '-O2', '-std=gnu17', '-pipe', '-o', 'main', 'main.c', '-lm'], run: ['./main'] },
  cpp: { name: 'cpp', source: 'main.cpp', compile: ['g++', '-O2', '-std=gnu++17', '-pipe', '-o', 'main', 'main.cpp'], run: ['./main'] },
};

/** Accepted spellings (SandboxFusion uses "python" and "cpp"). */
const ALIASES: Record<string, Language> = {
  python3: 'python3',
  python: 'python3',
  py: 'python3',
  bash: 'bash',
  sh: 'bash',
  c: 'c',
  cpp: 'cpp',
  'c++': 'cpp',
  cxx: 'cpp',
};

export function languageOf(name: string): Language | null {
  return Object.prototype.hasOwnProperty.call(ALIASES, name) ? ALIASES[name]! : null;
}

export const LANGUAGE_NAMES = Object.keys(ALIASES);

export const DEFAULT_COMPILE_TIMEOUT_MS = 30_000;
