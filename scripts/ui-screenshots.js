#!/usr/bin/env node
// Regenerate docs/ui/*.png: run the browser test of the dashboard (a real `warren up`, headless
// chromium) with WARREN_UI_SCREENSHOTS set, so the pictures show exactly what the test checked.
// Needs a build (npm run build) and root, like the test itself.
'use strict';
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const out = path.join(root, 'docs/ui');
const r = spawnSync('npx', ['ava', 'dist/test/ui/dashboard.test.js'], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, WARREN_UI_SCREENSHOTS: out },
});
if (r.status !== 0) process.exit(r.status ?? 1);
console.log(`screenshots in ${path.relative(root, out)}/`);
