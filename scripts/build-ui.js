#!/usr/bin/env node
// Build the dashboard: bundle src/ui (TypeScript, xterm.js from npm, CSS) into dist/ui with esbuild.
// Nothing is fetched at run time: the gateway serves these files from dist/ui.
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const esbuild = require('esbuild');

const root = path.resolve(__dirname, '..');
const src = path.join(root, 'src/ui');
const out = path.join(root, 'dist/ui');

async function main() {
  fs.rmSync(out, { recursive: true, force: true });
  fs.mkdirSync(out, { recursive: true });
  await esbuild.build({
    entryPoints: { app: path.join(src, 'main.ts') },
    bundle: true,
    format: 'iife',
    target: ['chrome110', 'firefox110', 'safari16'],
    outdir: out,
    minify: true,
    sourcemap: true,
    legalComments: 'linked',
    logLevel: 'warning',
  });
  fs.copyFileSync(path.join(src, 'index.html'), path.join(out, 'index.html'));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
