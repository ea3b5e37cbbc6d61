"""Test-time search over reasoning traces: voting now; Gambit, STEP, DeepConf build on it."""
