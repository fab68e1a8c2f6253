#!/usr/bin/env bash
# Device call of run 27 (2026-12-01, session 9): run 26's call again, after the LoRA group and weight-copy fixes.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run27.sh
LOGS=/tmp/dl_run27 bash results/device_calls/run26.sh
