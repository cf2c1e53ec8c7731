"""Where hooks run: the interceptor (decode, hook, forward), the pipeline and the planner that
compute plans, remote hook servers, and our own RuntimeHookService."""
