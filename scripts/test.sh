#!/usr/bin/env bash
# Install everything a fresh Debian 12 machine needs, build, and run the whole test suite:
# the TypeScript tests (ava), then the Python SDK's tests (pytest against a real `warren up`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Lint includes the type check (tsc --noEmit with the unused-code checks) and the project rules.
npm run --silent lint
# The Debian default image is tested too; its build is cached in /var/cache/warren after the first run.
export WARREN_TEST_DEBIAN="${WARREN_TEST_DEBIAN:-1}"
# What the suite leaves behind (cgroups, mounts, helper processes) is a failure too.
audit="$(mktemp /tmp/warren-leak-audit.XXXXXX)"
trap 'rm -f "$audit"' EXIT
node scripts/leak-audit.js snapshot "$audit"
ava_rc=0
npx ava "$@" || ava_rc=$?
# Debian's interpreter explicitly: it is the one that sees python3-httpx, -websockets, -pytest.
py_rc=0
/usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests || py_rc=$?
if [ "$py_rc" -eq 5 ]; then
  echo "test: pytest collected no tests (python/tests is missing or broken)" >&2
fi
leak_rc=0
node scripts/leak-audit.js check "$audit" || leak_rc=$?
if [ "$ava_rc" -ne 0 ] || [ "$py_rc" -ne 0 ] || [ "$leak_rc" -ne 0 ]; then
  echo "test: failed (ava exit $ava_rc, pytest exit $py_rc, leak audit exit $leak_rc)" >&2
  exit 1
fi
