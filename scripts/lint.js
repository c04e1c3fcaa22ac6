#!/usr/bin/env node
// Project rules the type checker cannot see. Exits non-zero with one line per finding.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const findings = [];

function walk(dir, exts, out = []) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (entry.name === 'node_modules' || entry.name === 'dist' || entry.name === 'build' || entry.name === 'out') continue;
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) walk(p, exts, out);
    else if (exts.some((e) => entry.name.endsWith(e))) out.push(p);
  }
  return out;
}

// 1. Tests assert behaviour: no focused tests, no assertions that hold whatever happened, every
//    skip says why (test/helpers/skip.ts puts the reason into the title), and waiting is on a
//    condition (test/helpers/wait.ts), not a bare sleep.
const SKIP_HELPER = path.join(root, 'test/helpers/skip.ts');
const WAIT_HELPER = path.join(root, 'test/helpers/wait.ts');
for (const file of walk(path.join(root, 'test'), ['.ts'])) {
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  lines.forEach((line, i) => {
    const where = `${path.relative(root, file)}:${i + 1}`;
    if (/\b(test|it)(\.serial)?\.only\(/.test(line)) findings.push(`${where}: focused test (.only)`);
    if (/\bt\.pass\(\)/.test(line)) findings.push(`${where}: t.pass() asserts nothing`);
    if (/\.log\(\s*(skip|why|reason)\s*\)\s*\)/.test(line)) findings.push(`${where}: a test whose body only logs passes without asserting; skip it with its reason (testUnless)`);
    if (/\bt\.not\([^,]+,\s*undefined\s*\)/.test(line)) findings.push(`${where}: t.not(x, undefined) holds for almost any outcome; assert what x must be`);
    if (file !== SKIP_HELPER) {
      if (/\?\s*(any)?[Tt]est(\.serial)?\s*:\s*(any)?[Tt]est\.skip\b|\?\s*(any)?[Tt]est\.skip\s*:/.test(line)) findings.push(`${where}: a conditional test.skip without its reason in the title; use testUnless(reason) from test/helpers/skip`);
      else if (/\b(any)?[Tt]est\.skip\(/.test(line) && !/\(skipped: /.test(line)) findings.push(`${where}: test.skip without "(skipped: <reason>)" in its title`);
    }
    if (file !== WAIT_HELPER && /^\s*await (new Promise\(\(?\w*\)? => setTimeout\(|sleep\(|delay\()/.test(line)) {
      // a sleep between the tries of a polling loop is fine: look at the block that encloses it
      const indent = /^\s*/.exec(line)[0].length;
      let opener = '';
      for (let j = i - 1; j >= 0; j--) {
        if (lines[j].trim() !== '' && /^\s*/.exec(lines[j])[0].length < indent) {
          opener = lines[j];
          break;
        }
      }
      if (!/^\s*(while|for|do)\b/.test(opener)) findings.push(`${where}: a bare sleep as synchronisation; wait on the condition (waitFor) or say why time must pass (elapse)`);
    }
  });
}

// 2. Every error code the native helper can throw is a stable code of src/errors.ts.
const errorsTs = fs.readFileSync(path.join(root, 'src/errors.ts'), 'utf8');
const known = new Set([...errorsTs.matchAll(/^\s{2}([A-Z_]+): \d{3},$/gm)].map((m) => m[1]));
for (const file of walk(path.join(root, 'native/helper/src'), ['.c', '.cc', '.h'])) {
  const text = fs.readFileSync(file, 'utf8');
  for (const m of text.matchAll(/(?:return|ThrowCode\(env,)\s*"([A-Z][A-Z_]+)"/g)) {
    if (m[1] !== 'OK' && !known.has(m[1])) findings.push(`${path.relative(root, file)}: native error code ${m[1]} is not in src/errors.ts`);
  }
}

// 3. No stray debugging output in library code (the CLI and benchmarks print on purpose).
for (const file of walk(path.join(root, 'src'), ['.ts'])) {
  const rel = path.relative(root, file);
  if (rel.startsWith('src/cli/')) continue;
  fs.readFileSync(file, 'utf8').split('\n').forEach((line, i) => {
    if (/^\s*console\.(log|debug)\(/.test(line)) findings.push(`${rel}:${i + 1}: console.${/console\.(\w+)/.exec(line)[1]} in library code`);
  });
}

// 4. The node never depends on the gateway: src/shim runs without it (a node process, other gateways).
const GATEWAY = path.join(root, 'src/gateway');
for (const file of walk(path.join(root, 'src/shim'), ['.ts'])) {
  fs.readFileSync(file, 'utf8').split('\n').forEach((line, i) => {
    for (const m of line.matchAll(/(?:from\s+|import\(|require\()'([^']+)'/g)) {
      if (!m[1].startsWith('.')) continue;
      const target = path.resolve(path.dirname(file), m[1]);
      if (target === GATEWAY || target.startsWith(GATEWAY + path.sep)) findings.push(`${path.relative(root, file)}:${i + 1}: src/shim imports ${m[1]} (src/gateway); shared code belongs in a neutral module`);
    }
  });
}

if (findings.length > 0) {
  for (const f of findings) console.error(f);
  console.error(`lint: ${findings.length} finding(s)`);
  process.exit(1);
}
console.log('lint: ok');
