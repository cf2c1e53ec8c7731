"""The bind path's aiohttp client carries the official ``ApiClient``'s configuration: auth
headers (refreshed tokens included), default headers, TLS settings and proxy rules."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import kubernetes
import pytest
from aiohttp import web

from rhp_kube.http import _ssl_context
from scheduler_ext.errors import APIError, ConflictError
from scheduler_ext.kube import BindClient


def _config(host: str, **attrs: Any) -> kubernetes.client.Configuration:
    conf = kubernetes.client.Configuration()
    conf.host = host
    for key, value in attrs.items():
        setattr(conf, key, value)
    return conf


async def _server(replies: list[tuple[int, dict[str, Any]]], seen: list[dict[str, Any]]) -> tuple[web.AppRunner, str]:
    """A stand-in API server recording every request; answers ``replies`` in order, then 200."""
    async def handle(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.raw_path, "headers": dict(request.headers),
                     "body": await request.read()})
        status, body = replies.pop(0) if replies else (200, {})
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_requests_carry_the_api_clients_auth_and_headers() -> None:
    seen: list[dict[str, Any]] = []
    runner, url = await _server([], seen)
    tokens = iter(["first", "second"])

    def refresh(conf: kubernetes.client.Configuration) -> None:
        conf.api_key["authorization"] = next(tokens)

    conf = _config(url, api_key={"authorization": "expired"}, api_key_prefix={"authorization": "Bearer"})
    conf.refresh_api_key_hook = refresh
    api_client = kubernetes.client.ApiClient(conf)
    api_client.user_agent = "scheduler-ext/test"
    client = BindClient(api_client, timeout=5)
    try:
        await client.patch_pod_annotations("ns", "p/x", {"a": "1", "b": None}, "7")
        await client.bind_pod("ns", "p", "uid-1", "n1", {"k": "v"}, "8")
    finally:
        await client.aclose()
        await runner.cleanup()
    patch, binding = seen
    assert patch["method"] == "PATCH" and patch["path"] == "/api/v1/namespaces/ns/pods/p%2Fx"
    assert patch["headers"]["Content-Type"] == "application/merge-patch+json"
    assert patch["headers"]["Authorization"] == "Bearer first"
    assert patch["headers"]["User-Agent"] == "scheduler-ext/test"
    assert b'"resourceVersion":"7"' in patch["body"] and b'"b":null' in patch["body"]
    assert binding["headers"]["Authorization"] == "Bearer second"  # the hook ran again
    assert binding["path"] == "/api/v1/namespaces/ns/pods/p/binding"
    assert b'"uid":"uid-1"' in binding["body"] and b'"resourceVersion":"8"' in binding["body"]
    assert b'"annotations":{"k":"v"}' in binding["body"]


async def test_status_objects_become_typed_errors() -> None:
    seen: list[dict[str, Any]] = []
    replies = [(409, {"kind": "Status", "message": "the object has been modified", "reason": "Conflict"}),
               (500, {"kind": "Status", "message": "etcd is sad"})]
    runner, url = await _server(replies, seen)
    client = BindClient(kubernetes.client.ApiClient(_config(url)), timeout=5)
    try:
        with pytest.raises(ConflictError, match="has been modified"):
            await client.replace_lease("kube-system", "l", {"metadata": {"resourceVersion": "1"}})
        with pytest.raises(APIError, match="etcd is sad") as info:
            await client.get_lease("kube-system", "l")
        assert info.value.status == 500
    finally:
        await client.aclose()
        await runner.cleanup()


def test_tls_settings_follow_the_configuration(tmp_path: Any) -> None:
    strict = _ssl_context(_config("https://api:6443"))
    assert strict.verify_mode == ssl.CERT_REQUIRED and strict.check_hostname
    loose = _ssl_context(_config("https://api:6443", verify_ssl=False))
    assert loose.verify_mode == ssl.CERT_NONE and not loose.check_hostname
    no_name = _ssl_context(_config("https://api:6443", assert_hostname=False))
    assert no_name.verify_mode == ssl.CERT_REQUIRED and not no_name.check_hostname
    with pytest.raises(OSError):  # a missing CA file fails at start, not at the first bind
        _ssl_context(_config("https://api:6443", ssl_ca_cert=str(tmp_path / "missing.crt")))


def test_a_socks_proxy_is_refused_with_a_clear_error() -> None:
    api_client = kubernetes.client.ApiClient(_config("https://api:6443"))
    api_client.configuration.proxy = "socks5://proxy:1080"  # the ApiClient itself needs PySocks for it
    with pytest.raises(ValueError, match="SOCKS"):
        BindClient(api_client)
    conf = _config("https://api:6443", proxy="http://proxy:3128", no_proxy="api")
    BindClient(kubernetes.client.ApiClient(conf))  # bypassed for this host: fine
