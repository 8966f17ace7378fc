"""The plugin's kubeconfig loader: what it accepts, and the credentials it refuses to ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from cni_plugin.kube.config import load_kubeconfig
from netconf.errors import INVALID_CONFIG, CniError

TEMPLATE = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://10.0.0.1:6443/"}}}}]
users: [{{name: plugin, user: {user}}}]
contexts: [{{name: x, context: {{cluster: c, user: plugin}}}}]
current-context: x
"""


def kubeconfig(tmp_path: Path, user: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(TEMPLATE.format(user=user))
    return str(path)


def test_a_token_user_loads(tmp_path: Path) -> None:
    creds = load_kubeconfig(kubeconfig(tmp_path, "{token: abc}"))
    assert creds.server == "https://10.0.0.1:6443" and creds.bearer_token() == "abc"


@pytest.mark.parametrize(("user", "named"), [
    ("{exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}}", "exec"),
    ("{auth-provider: {name: oidc}}", "auth-provider"),
    ("{username: admin, password: secret}", "username"),
])
def test_an_auth_method_the_client_cannot_perform_is_code_7_naming_it(
        tmp_path: Path, user: str, named: str) -> None:
    with pytest.raises(CniError) as refused:
        load_kubeconfig(kubeconfig(tmp_path, user))
    assert refused.value.code == INVALID_CONFIG
    assert repr(named) in refused.value.msg and "'plugin'" in refused.value.msg
