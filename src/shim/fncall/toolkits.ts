/**
 * Toolkit layers of the judge: Debian packages installed over the judge image
 * (and the toolkits they need, `below`), one layer per language family, each
 * built once per node and cached in the node cache (LayerStore.buildDebianLayer).
 * Adding or upgrading a toolkit rebuilds that layer only (and the few built on it).
 *
 * `lazy` toolkits are large and rarely used; they are built when a pool (or a
 * /run_code request) first needs them, never by the default test suite.
 */
import { LANGUAGES } from './languages';
import type { Language, PoolSpec } from './types';
import { lookupTable } from '../../validation';

export interface ToolkitDef {
  name: string;
  packages: string[];
  /** Toolkits this one is installed over (besides the python toolkit and the judge image). */
  below: string[];
  lazy?: boolean;
}

export const TOOLKITS: Record<string, ToolkitDef> = lookupTable({
  python: {
    name: 'python',
    packages: ['python3-numpy', 'python3-pandas', 'python3-scipy', 'python3-sympy', 'python3-requests', 'python3-pytest', 'python3-sortedcontainers', 'python3-networkx', 'python3-dateutil', 'python3-regex', 'python3-yaml', 'python3-matplotlib', 'python3-ipykernel', 'python3-jupyter-client'],
    below: [],
  },
  java: { name: 'java', packages: ['openjdk-17-jdk-headless', 'junit5'], below: [] },
  scala: { name: 'scala', packages: ['scala'], below: ['java'] },
  kotlin: { name: 'kotlin', packages: ['kotlin'], below: ['java'], lazy: true },
  node: { name: 'node', packages: ['nodejs', 'node-typescript', 'jest'], below: [] },
  go: { name: 'go', packages: ['golang-go'], below: [] },
  rust: { name: 'rust', packages: ['rustc'], below: [] },
  php: { name: 'php', packages: ['php-cli'], below: [] },
  ruby: { name: 'ruby', packages: ['ruby'], below: [] },
  perl: { name: 'perl', packages: ['perl'], below: [] },
  lua: { name: 'lua', packages: ['lua5.4'], below: [] },
  r: { name: 'r', packages: ['r-base-core'], below: [] },
  mono: { name: 'mono', packages: ['mono-mcs', 'mono-runtime'], below: [] },
  d: { name: 'd', packages: ['ldc'], below: [] },
  racket: { name: 'racket', packages: ['racket'], below: [], lazy: true },
  verilog: { name: 'verilog', packages: ['iverilog'], below: [] },
});

/** The layer name a toolkit is registered under in the layer store. */
export function toolkitLayerName(name: string): string {
  return `fncall-${name}`;
}

/** A toolkit and everything it is installed over, top-most first (without the python toolkit and the image). */
export function toolkitClosure(names: string[]): string[] {
  const out: string[] = [];
  const visit = (n: string) => {
    const t = TOOLKITS[n];
    if (t === undefined || out.includes(n)) return;
    for (const b of t.below) visit(b);
    out.push(n);
  };
  for (const n of names) visit(n);
  return out.reverse();
}

/** The judge image's name (the toolkits are built over it). */
export const JUDGE_IMAGE = 'judge';

/**
 * The layers a pool stacks over its image, top-most first: its own layers, then the toolkits it
 * names with the ones they are built on, and (on the judge image) the python toolkit at the bottom.
 */
export function poolLayerStack(spec: Pick<PoolSpec, 'image' | 'layers'>): string[] {
  const own = spec.layers.filter((l) => TOOLKITS[l] === undefined);
  if (spec.image !== JUDGE_IMAGE) return own;
  const kits = toolkitClosure(spec.layers.filter((l) => TOOLKITS[l] !== undefined && l !== 'python'));
  return [...own, ...kits, 'python'];
}

/** The languages a pool carries: those of the judge image and of the toolkits it stacks. */
export function poolLanguages(spec: Pick<PoolSpec, 'image' | 'layers'>): Language[] {
  const stack = poolLayerStack(spec);
  return Object.values(LANGUAGES)
    .filter((l) => l.toolkit === null || (spec.image === JUDGE_IMAGE && stack.includes(l.toolkit)))
    .map((l) => l.name);
}
