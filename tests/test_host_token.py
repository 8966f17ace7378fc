"""The token the installer writes for the host's kubeconfig: the plugin's ServiceAccount's,
bound to the Node, when the installer runs as another account (the DaemonSet's
`vpc-attach-installer`); the installer's own projected token otherwise."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field

import pytest

from cni_plugin.install.credentials import (
    RENEW_AFTER,
    HostToken,
    ServiceAccount,
    request_node_token,
    service_account_of,
)
from cni_plugin.install.errors import InstallError

CA_PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def jwt(subject: str, expiry: float) -> bytes:
    """A token shaped like a ServiceAccount token (signature not checked)."""
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    return f"{part({'alg': 'RS256'})}.{part({'sub': subject, 'exp': expiry})}.sig\n".encode()


INSTALLER = ServiceAccount(jwt("system:serviceaccount:kube-system:vpc-attach-installer",
                               time.time() + 3600), CA_PEM, "kube-system")


@dataclass
class Requests:
    """A TokenRequest stand-in: the calls made, answering a fresh token lasting `life` s."""

    life: float = 3600.0
    made: list[tuple[str, str, str, str, int]] = field(default_factory=list)

    def __call__(self, server: str, account: ServiceAccount, namespace: str, name: str,
                 node: str, seconds: int) -> bytes:
        assert account is INSTALLER  # asked as the installer, never as the plugin
        self.made.append((server, namespace, name, node, seconds))
        return jwt(f"system:serviceaccount:{namespace}:{name}", time.time() + self.life) + \
            str(len(self.made)).encode()


def test_an_installer_of_its_own_account_writes_the_plugins_token_bound_to_the_node() -> None:
    requests = Requests()
    host = HostToken("https://api:6443", "worker-1", request=requests).for_host(INSTALLER)
    assert requests.made == [("https://api:6443", "kube-system", "vpc-attach", "worker-1", 3600)]
    assert service_account_of(host.token) == ("kube-system", "vpc-attach")
    assert (host.ca_pem, host.namespace) == (INSTALLER.ca_pem, INSTALLER.namespace)


def test_the_host_token_is_kept_until_most_of_its_life_passed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    requests = Requests(life=1000.0)
    tokens = HostToken("https://api:6443", "worker-1", request=requests)
    now = time.time()
    first = tokens.for_host(INSTALLER).token
    monkeypatch.setattr(time, "time", lambda: now + RENEW_AFTER * 1000.0 - 5)
    assert tokens.for_host(INSTALLER).token == first and len(requests.made) == 1
    monkeypatch.setattr(time, "time", lambda: now + RENEW_AFTER * 1000.0 + 5)
    assert tokens.for_host(INSTALLER).token != first and len(requests.made) == 2


def test_an_installer_running_as_the_plugin_copies_its_own_token() -> None:
    plugin = ServiceAccount(jwt("system:serviceaccount:kube-system:vpc-attach",
                                time.time() + 3600), CA_PEM, "kube-system")
    requests = Requests()
    assert HostToken("https://api:6443", "worker-1", request=requests).for_host(plugin) is plugin
    assert requests.made == []  # the earlier releases' way: bound to the Pod


def test_a_token_request_that_fails_names_the_permission_it_needs() -> None:
    # The fake CA cannot even be loaded; a refused (403) or unanswered request ends the same
    # way: an InstallError, so the init container fails and is retried, never a half-written
    # kubeconfig.
    with pytest.raises(InstallError) as refused:
        request_node_token("https://127.0.0.1:9", INSTALLER, "kube-system", "vpc-attach",
                           "worker-1", 3600)
    assert "cannot get a token of ServiceAccount kube-system/vpc-attach bound to Node " \
        "worker-1" in refused.value.message
    assert "serviceaccounts/token" in (refused.value.hint or "")


@pytest.mark.parametrize("subject, account", [
    ("system:serviceaccount:ns:name", ("ns", "name")),
    ("system:serviceaccount:ns", None),
    ("system:node:worker-1", None),
    ("a", None),
])
def test_the_account_a_token_names_is_read_from_its_subject(
        subject: str, account: tuple[str, str] | None) -> None:
    assert service_account_of(jwt(subject, 0)) == account
