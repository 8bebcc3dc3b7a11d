#!/usr/bin/env bash
# Install esiwrap with the documentation's needs into .venv, then serve the site (docs/, mkdocs.yml)
# on http://127.0.0.1:8000, rebuilt on every change. Usage: scripts/docs.sh [mkdocs serve options...]
# (e.g. --dev-addr 127.0.0.1:8001). `.venv/bin/mkdocs build --strict` builds it into site/ as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[docs]'
exec .venv/bin/mkdocs serve --strict "$@"
