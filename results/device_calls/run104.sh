#!/usr/bin/env bash
# Run 104 (2026-12-06, H100, the same warm machine as run 103): case C of run103.sh, which the call ran as
#   bash .devwheels/install.sh >/dev/null 2>&1; timeout 440 bash .snap/next.sh C   (.snap/next.sh = run103.sh)
exec bash "$(dirname "${BASH_SOURCE[0]}")/run103.sh" C
