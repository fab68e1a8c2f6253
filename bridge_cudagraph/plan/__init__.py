"""From a config to the frozen plan of what will be captured, pure arithmetic on plain numbers.

Reading order: :mod:`~bridge_cudagraph.plan.from_config` (the one entry point), :mod:`~.facts` (what the provider and
the config say), :mod:`~.checks` (every refusal of a run), :mod:`~.build` (the decisions), :mod:`~.capture_plan` (the
result), :mod:`~.describe` (its text); :mod:`~.budgets`, :mod:`~.sizes` and :mod:`~.memory` hold the arithmetic the
capture shares."""
