#!/usr/bin/env bash
# Install everything a fresh Debian 12 machine needs, build, and start Warren on
# its embedded default: one node, SQLite, local layer store, Debian default image.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec node dist/src/cli/main.js up --listen "${WARREN_LISTEN:-127.0.0.1:7070}" --data-dir "${WARREN_DATA_DIR:-/var/lib/warren}" "$@"
