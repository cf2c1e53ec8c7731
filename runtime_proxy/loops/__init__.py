"""Background control loops: the reconciler, the cfsQuotaBurst loop and their task helper."""
