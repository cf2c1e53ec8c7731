"""Background control loops: the reconciler, the CPU burst loop, the usage loop, their evictors,
the usage sampler and the task helper. They run stages through the hook runner, never a plugin."""
