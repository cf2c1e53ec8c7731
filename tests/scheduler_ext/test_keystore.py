"""The signing key and the public keys the extender keeps in the cluster
(``scheduler_ext.keystore``, issue 37 item 2): made once, by whichever replica comes first, never
replaced by a restart, a second replica or a lost race; the public keys only grow, so a new key
leaves every earlier signature verifiable. The same against the real API server:
``tests/e2e/test_e2e_helm.py``."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest

from koord_formats import keys
from koord_formats.signature import parse_public_keys
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.keystore import CONFIGMAP_KEY, SECRET_KEY, KeyStoreError, keys_from_cluster
from scheduler_ext.trust import SIGNED, Signer, Trust

NS, SECRET, CM = "rhp-system", "rhp-signing-key", "rhp-public-keys"


class FakeKeyAPI:
    """Secrets and ConfigMaps in memory with create-if-absent and resourceVersion CAS."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 0
        self.before_create: list[Any] = []  # callbacks run once before the next create (races)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        if (kind, name) not in self.objects:
            raise NotFoundError(404, f"{kind} {name} not found")
        return copy.deepcopy(self.objects[(kind, name)])

    def create(self, kind: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        while self.before_create:
            self.before_create.pop(0)()
        name = body["metadata"]["name"]
        if (kind, name) in self.objects:
            raise ConflictError(409, "AlreadyExists")
        self.rv += 1
        obj = copy.deepcopy(dict(body))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[(kind, name)] = obj
        return copy.deepcopy(obj)

    def replace(self, kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        have = self.objects[(kind, name)]
        if body["metadata"].get("resourceVersion") != have["metadata"]["resourceVersion"]:
            raise ConflictError(409, "the object has been modified")
        self.rv += 1
        obj = copy.deepcopy(dict(body))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[(kind, name)] = obj
        return copy.deepcopy(obj)


def test_the_first_start_makes_the_key_and_later_starts_keep_it() -> None:
    api = FakeKeyAPI()
    signer, public = keys_from_cluster(api, NS, SECRET, CM)
    assert public == (signer.public_raw,)
    secret = api.objects[("secrets", SECRET)]
    assert "ownerReferences" not in secret["metadata"]
    assert "app.kubernetes.io/instance" not in secret["metadata"].get("labels", {}), "not the release's"
    again, public_again = keys_from_cluster(api, NS, SECRET, CM)
    assert again.public_raw == signer.public_raw and public_again == public
    assert api.rv == 2, "nothing was written again"


def test_a_replica_that_loses_the_race_signs_with_the_winner_s_key() -> None:
    api = FakeKeyAPI()
    winner = Signer.generate()
    pem = base64.b64encode(winner.pem()).decode()
    api.before_create.append(lambda: api.create("secrets", NS, {"metadata": {"name": SECRET},
                                                                 "data": {SECRET_KEY: pem}}))  # fmt: skip
    signer, public = keys_from_cluster(api, NS, SECRET, CM)
    assert signer.public_raw == winner.public_raw and public == (winner.public_raw,)


def test_a_new_key_keeps_the_old_public_keys_so_running_pods_still_verify() -> None:
    api = FakeKeyAPI()
    old, _ = keys_from_cluster(api, NS, SECRET, CM)
    ann = {keys.ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0-1"})}
    ann[keys.ANNOTATION_ALLOCATION_SIGNATURE] = Trust.of(old, []).sign("u", "ns", "p", "n", 2000, ann) or ""
    del api.objects[("secrets", SECRET)]  # lost, or deleted to rotate
    new, public = keys_from_cluster(api, NS, SECRET, CM)
    assert new.public_raw != old.public_raw and public == (old.public_raw, new.public_raw)
    assert Trust.of(new, [], public).judge("u", "ns", "p", "n", "", ann) == SIGNED
    text = api.objects[("configmaps", CM)]["data"][CONFIGMAP_KEY]
    assert parse_public_keys(text) == public


def test_a_concurrent_change_of_the_config_map_is_kept() -> None:
    api = FakeKeyAPI()
    first, _ = keys_from_cluster(api, NS, SECRET, CM)
    del api.objects[("secrets", SECRET)]
    other = Signer.generate().public_raw
    original = api.replace

    def racing_replace(kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        api.replace = original  # type: ignore[method-assign]
        cm = api.objects[("configmaps", CM)]
        line = "ed25519 " + base64.b64encode(other).decode()
        original(kind, namespace, name, {**cm, "data": {CONFIGMAP_KEY: cm["data"][CONFIGMAP_KEY] + line + "\n"}})
        return original(kind, namespace, name, body)  # stale: 409, read again

    api.replace = racing_replace  # type: ignore[method-assign]
    new, public = keys_from_cluster(api, NS, SECRET, CM)
    assert public == (first.public_raw, other, new.public_raw)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        pytest.param({"data": {}}, "has no 'signing.key'", id="no key"),
        pytest.param({"data": {SECRET_KEY: base64.b64encode(b"not a pem").decode()}}, "not an unencrypted PEM",
                     id="not PEM"),
        pytest.param({"data": {SECRET_KEY: "%%%"}}, "is not base64", id="not base64"),
    ],
)
def test_a_broken_secret_is_a_clear_error_and_never_replaced(obj: dict[str, Any], message: str) -> None:
    api = FakeKeyAPI()
    api.create("secrets", NS, {"metadata": {"name": SECRET}, **obj})
    before = copy.deepcopy(api.objects)
    with pytest.raises(KeyStoreError, match=message):
        keys_from_cluster(api, NS, SECRET, CM)
    assert api.objects == before


def test_the_keys_go_through_the_one_transport_against_an_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KubeKeyAPI`` (what ``serve --key-secret`` uses) on the fake API server through
    ``rhp_kube.http``: the first start creates the Secret and the ConfigMap, the second reads the
    same key and writes nothing; a missing object is ``NotFoundError``, a create that loses a
    race ``ConflictError``. The generated client's CoreV1Api is made unusable: the old main's
    KubeKeyAPI went through it."""
    import kubernetes

    from scheduler_ext.kube import KubeKeyAPI
    from tests.fakeapi import FakeAPIServer

    def no_generated_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("a key call went through the generated client")

    monkeypatch.setattr(kubernetes.client, "CoreV1Api", no_generated_client)
    with FakeAPIServer() as server:
        server.register("", "v1", "secrets", "Secret", True)
        conf = kubernetes.client.Configuration()
        conf.host = server.url
        key_api = KubeKeyAPI(kubernetes.client.ApiClient(conf))
        try:
            signer, public = keys_from_cluster(key_api, NS, SECRET, CM)
            assert public == (signer.public_raw,)
            stored = server.get("Secret", SECRET, NS)
            assert stored is not None and SECRET_KEY in stored["data"]
            versions = (stored["metadata"]["resourceVersion"],
                        server.get("ConfigMap", CM, NS)["metadata"]["resourceVersion"])  # type: ignore[index]  # fmt: skip
            again, public_again = keys_from_cluster(key_api, NS, SECRET, CM)
            assert again.public_raw == signer.public_raw and public_again == public
            assert (server.get("Secret", SECRET, NS)["metadata"]["resourceVersion"],  # type: ignore[index]
                    server.get("ConfigMap", CM, NS)["metadata"]["resourceVersion"]) == versions  # type: ignore[index]  # fmt: skip
            with pytest.raises(NotFoundError):
                key_api.get("secrets", NS, "absent")
            with pytest.raises(ConflictError):
                key_api.create("secrets", NS, {"metadata": {"name": SECRET}, "data": {}})
        finally:
            key_api.close()
