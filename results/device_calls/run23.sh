#!/usr/bin/env bash
# Device call of run 23 (2026-12-01, session 8): issue #17's 8B LoRA recipe again, after run 22 stopped at model
# construction (gradient_accumulation_fusion without APEX; the recipe now sets it off). The same steps as run 22:
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run23.sh
exec bash "$(dirname "$0")/run22.sh" "$@"
