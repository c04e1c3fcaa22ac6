#!/usr/bin/env bash
# Install everything a fresh Debian 12 machine needs, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Lint includes the type check (tsc --noEmit with the unused-code checks) and the project rules.
npm run --silent lint
# The Debian default image is tested too; its build is cached in /var/cache/warren after the first run.
export WARREN_TEST_DEBIAN="${WARREN_TEST_DEBIAN:-1}"
npx ava "$@"
