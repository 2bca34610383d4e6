"""The gates: one module per gate (gauntlet.steps.STEPS names them)."""
