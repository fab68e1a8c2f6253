#!/usr/bin/env bash
# Device call of run 28 (2026-12-01, session 9): run 26's call again (4 measured steps), after run 27 measured every
# variant and then failed each one's closing parity check on a buffer the model makes at its first forward.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run28.sh
STEPS=4 LOGS=/tmp/dl_run28 bash results/device_calls/run26.sh
