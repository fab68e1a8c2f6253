#!/usr/bin/env bash
# Run 101 (2026-12-05, ninth session, H100): teardown alone, case T of run98.sh, which the call ran as
#   bash .devwheels/install.sh >/dev/null 2>&1; timeout 540 bash .snap/next.sh T   (.snap/next.sh = run98.sh)
exec bash "$(dirname "${BASH_SOURCE[0]}")/run98.sh" T
