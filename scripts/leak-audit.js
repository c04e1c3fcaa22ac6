#!/usr/bin/env node
// What the whole test suite leaves on the host: Warren cgroups, mounts and helper processes that
// were not there before it ran. Each test file checks its own scope; this catches what falls
// between them (a teardown that kill -9s a node with prepared sandboxes, a helper that forgets a
// mount). Linux only, run as root by scripts/test.sh:
//   node scripts/leak-audit.js snapshot FILE   record what exists now
//   node scripts/leak-audit.js check FILE      exit 1, listing them, if new ones are still there
//                                              after a grace period (teardowns finish asynchronously;
//                                              LEAK_AUDIT_GRACE_MS, 20 s by default)
'use strict';
const fs = require('node:fs');
const path = require('node:path');
// the project's own mountinfo parser (built by scripts/setup.sh before the suite runs)
const { readMountInfo } = require('../dist/src/shim/layers/sys');

// names as the kernel keeps them (comm: 15 characters at most)
const HELPERS = new Set(['warren-init', 'warren-session', 'warren-agent', 'warren-vmshell', 'firecracker', 'warren-nsexec', 'qemu-system-x86', 'warren-vmm-exec', 'warren-lazyfs', 'etcd', 'docker-registry']);
const GRACE_MS = Number(process.env.LEAK_AUDIT_GRACE_MS ?? 20_000);

/** The groups inside each hierarchy's warren* directories, and those directories but the parent
    group `warren` itself, which every node shares and keeps. */
function cgroups() {
  const out = [];
  for (const m of readMountInfo()) {
    if (m.fstype !== 'cgroup' && m.fstype !== 'cgroup2') continue;
    let top;
    try {
      top = fs.readdirSync(m.mountPoint, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const d of top) {
      if (!d.isDirectory() || !d.name.startsWith('warren')) continue;
      const dir = path.join(m.mountPoint, d.name);
      if (d.name !== 'warren') out.push(dir);
      try {
        for (const g of fs.readdirSync(dir, { withFileTypes: true })) if (g.isDirectory()) out.push(path.join(dir, g.name));
      } catch {
        /* removed meanwhile */
      }
    }
  }
  return out;
}

function mounts() {
  return readMountInfo()
    .filter((m) => m.fstype !== 'cgroup' && m.fstype !== 'cgroup2' && /warren/.test(m.mountPoint))
    .map((m) => `${m.mountPoint} (${m.fstype})`);
}

function processes() {
  const out = [];
  for (const pid of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
      if (!HELPERS.has(comm)) continue;
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (fields[0] === 'Z') continue;
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim().slice(0, 160);
      // pid and start time: a recycled pid is a different process
      out.push(`${pid}@${fields[19]} ${cmd || comm}`);
    } catch {
      /* exited meanwhile */
    }
  }
  return out;
}

function now() {
  return { cgroups: cgroups(), mounts: mounts(), processes: processes() };
}

function fresh(before) {
  const cur = now();
  const out = {};
  for (const k of Object.keys(cur)) {
    const had = new Set(before[k] ?? []);
    out[k] = cur[k].filter((x) => !had.has(x));
  }
  return out;
}

const count = (r) => Object.values(r).reduce((n, a) => n + a.length, 0);

async function main() {
  const [cmd, file] = process.argv.slice(2);
  if (!file || (cmd !== 'snapshot' && cmd !== 'check')) {
    console.error('usage: leak-audit.js snapshot|check FILE');
    process.exit(2);
  }
  if (cmd === 'snapshot') {
    fs.writeFileSync(file, JSON.stringify(now()));
    return;
  }
  const before = JSON.parse(fs.readFileSync(file, 'utf8'));
  const deadline = Date.now() + GRACE_MS;
  let left = fresh(before);
  while (count(left) > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 500));
    left = fresh(before);
  }
  if (count(left) === 0) {
    console.log('leak audit: the suite left no Warren cgroup, mount or helper process behind');
    return;
  }
  console.error(`leak audit: the suite left ${count(left)} behind:`);
  for (const [k, list] of Object.entries(left)) for (const x of list) console.error(`  ${k}: ${x}`);
  process.exit(1);
}

main().catch((err) => {
  console.error(`leak audit: ${err.stack || err}`);
  process.exit(2);
});
