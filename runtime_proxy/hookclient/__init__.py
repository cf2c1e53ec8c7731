"""The hook-server client: Koordinator's ``runtime.v1alpha1.RuntimeHookService``, proxy side.
``registration.py`` (the registration file's format), ``step.py`` (``RemoteStep``: one server
as a pipeline step, its gRPC call), ``registry.py`` (``HookServerRegistry``: the directory
watcher, the trust checks and the channels). The protocol's messages are built and read by
``runtime_proxy.codecs.hook``.

Started by ``serve`` and ``nri`` (``runtime_proxy/commands/``); it hands the pipeline
(``runtime_proxy.engine.pipeline.Pipeline.set_remote_steps``) one ``RemoteStep`` per registered
hook server, so hook servers run after the in-process plugins under the same policy model
(Fail/Ignore, timeouts, conflicts). ``runtime_proxy.hookserver.door`` (the server side) uses
the same codec.

Registrations. Every ``*.json`` file in the registration directory (``hookServerDir``, default
``/etc/runtime/hookserver.d``) registers one server, with Koordinator's keys::

    {"remote-endpoint": "/var/run/koordlet/koordlet.sock",
     "failure-policy": "Ignore",
     "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"],
     "timeout-seconds": 1.5}

- ``remote-endpoint``: an absolute unix socket path; ``unix://`` in front is accepted.
- ``failure-policy``: ``Fail``, ``Ignore``, ``None`` or empty (the last three all mean Ignore).
- ``runtime-hooks``: Koordinator hook point names; unknown names are logged and left out.
- ``timeout-seconds`` (our extension, optional): per-call timeout; default ``hookServerTimeout``.
  Koordinator has no timeout of its own (a hung server stalls kubelet's call).
- Any other key makes the file malformed (``RegistrationDocument``), with the key named.

The directory is polled every 0.5 s (a stat of each file; a file is re-read only when its
mtime, size or inode changed), so a file added, changed or removed takes effect within about a
second, with no restart. Polling instead of inotify is deliberate: it works on any filesystem,
survives the directory being deleted and re-created, and has no missed-event corner cases. A
missing directory is treated as empty until it appears. A malformed file is logged (once per
version of the file) and skipped; the other registrations are not disturbed.

Trust. A registration decides which socket the proxy sends every pod's data to, and with
``Fail`` it can block every pod, so only files that root (or the proxy's own user) controls are
read: the directory and each file must be owned by root or by the proxy's effective user and
must not be group- or world-writable; the directory itself and any file in it must not be a
symlink; a file is at most ``MAX_REGISTRATION_BYTES``. A registration whose endpoint is one of
the proxy's own sockets (its backend, containerd's, or its listen socket; compared by resolved
path and by inode) is refused. Every refusal is logged with its reason (once per version of the
file) and counted in ``rhp_hookserver_registrations_refused_total{reason}``; an unsafe directory
drops every registration until it is fixed.

Order. Koordinator calls only the first server that registered a hook point. We call every
server that registered it, in file-name order (byte order of the names, so ``10-a.json`` runs
before ``20-b.json``); each sees the request as changed by the in-process plugins and by the
servers before it.

Merge rules (Koordinator's ``UpdateRequest``/``updateResource``), turned into a ``Plan`` that
holds only what actually changes relative to the request the server saw, so the pipeline's
conflict rules apply (a server that sets a field an earlier step set to another value is a
conflict, decided by its policy):

- ``PreRunPodSandbox``: labels and annotations are overlaid (keys added or changed);
  a non-empty ``cgroup_parent`` replaces the sandbox's; ``resources`` is ignored (as in
  Koordinator's containerd mode).
- ``PreCreateContainer``: container annotations overlaid; ``container_resources`` (when the
  response carries it) by field: ``cpu_period``, ``cpu_shares``, ``memory_limit_in_bytes``,
  ``memory_swap_limit_in_bytes`` only when > 0; ``cpu_quota`` when != 0 (-1 allowed);
  ``oom_score_adj`` when in [-1000, 1000] (so 0 overwrites); ``cpuset_cpus`` and
  ``cpuset_mems`` always, even when empty (an empty cpuset clears the request's: a server must
  echo the resources it received); ``unified`` overlaid; hugepage limits ignored. A non-empty
  ``pod_cgroup_parent`` replaces the sandbox cgroup parent. A non-empty ``container_envs`` map
  replaces the environment in Koordinator; we set the keys it adds or changes and keep the
  others (a plan cannot delete a variable; keys left out are logged).
- ``PreUpdateContainerResources``: resources only, by the same field rules.
- ``PreStartContainer`` and every ``Post*`` hook: the response is ignored; only a failure
  counts (and post hooks never fail a call).

Pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true`` are never sent (the
interceptor skips all hooks for them; ``RemoteStep`` checks again).

Channels. One ``grpc.aio`` channel per endpoint, shared by every registration naming it, closed
(after the longest timeout, so calls in flight finish) when no registration names it any more.
"""

