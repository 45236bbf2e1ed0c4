"""The real node's configuration: the kubelet is not left open, containerd runs on its own socket
with what this machine needs, the apiserver is reachable from pods, and teardown finds every mount.
Nothing here reads the host: the CNI plugins' directory is a temporary one, as is every file."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from webhook.cluster import controlplane, pki, realnode

ADDRESS = "192.0.2.10"


@pytest.fixture
def cni_bin(tmp_path: Path) -> Path:
    """A directory standing in for the host's CNI plugins (only their names matter to the configuration)."""
    directory = tmp_path / "cni-bin"
    directory.mkdir()
    for plugin in realnode.CNI_PLUGINS:
        (directory / plugin).write_text("")
    return directory


@pytest.fixture
def state(tmp_path: Path) -> controlplane.State:
    pki.write_all(tmp_path / "pki")
    made = controlplane.State(directory=tmp_path, bin_dir=tmp_path / "bin", ports={"kube-apiserver": 16443})
    for name in ("kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics"):
        made.ports[name] = 20000 + len(made.ports)
    return made


def test_the_kubelet_refuses_anonymous_requests_and_asks_the_apiserver_to_authorize_every_one(
    state: controlplane.State, cni_bin: Path
) -> None:
    realnode.write_pki(state, address=ADDRESS)
    realnode.write_configs(state, address=ADDRESS, cni_bin=cni_bin)
    config = json.loads((realnode.node_dir(state) / "kubelet.yaml").read_text())
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["webhook"] == {"enabled": True}
    assert config["authentication"]["x509"]["clientCAFile"] == str(state.directory / "pki" / "ca.crt")
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0
    assert config["address"] == ADDRESS and config["healthzBindAddress"] == "127.0.0.1"
    assert config["cgroupDriver"] == "cgroupfs" and config["failCgroupV1"] is False
    serving = x509.load_pem_x509_certificate(Path(config["tlsCertFile"]).read_bytes())
    ips = [
        str(ip)
        for ip in serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.IPAddress
        )
    ]
    assert ips == [ADDRESS], "kubectl logs/exec dial the node IP, which the serving certificate must name"


def test_the_host_check_finds_every_tool_and_the_cni_plugins_when_they_are_there(tmp_path: Path, cni_bin: Path) -> None:
    everything = {tool: f"/usr/bin/{tool}" for tool in realnode.HOST_TOOLS}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert realnode.missing_host_tools(which=everything.get, cni_dirs=(empty, cni_bin)) == []
    assert realnode.cni_bin_dir((tmp_path / "absent", empty, cni_bin)) == cni_bin, "the first directory with every plugin"


def test_the_host_check_names_each_missing_tool_and_the_cni_plugins_with_their_packages(tmp_path: Path, cni_bin: Path) -> None:
    (cni_bin / "portmap").unlink()  # a directory with some plugins is not enough: the conflist names portmap
    present = {"ctr": "/usr/bin/ctr", "iptables": "/usr/sbin/iptables", "docker": "/usr/bin/docker"}
    dirs = (tmp_path / "absent", cni_bin)
    missing = realnode.missing_host_tools(which=present.get, cni_dirs=dirs)
    assert missing == ["containerd", "runc", realnode.CNI_PACKAGE]
    message = realnode.missing_tools_message(missing, cni_dirs=dirs)
    assert "\n" not in message
    assert "containerd, runc, the CNI plugins (bridge, host-local, portmap, loopback in " in message
    assert message.endswith("install with `apt-get install containerd containernetworking-plugins runc`")
    assert str(cni_bin) in message, "says where it looked"


@pytest.mark.parametrize("command", [["cluster", "up", "--real-node"], ["demo", "--real-node"]], ids=" ".join)
def test_a_real_node_command_says_what_is_missing_in_one_line_before_building_anything(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook import cli
    from webhook.cluster import binaries

    def no_build(**_: object) -> Path:
        raise AssertionError("built the binaries before checking the host")

    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda tool: None if tool == "runc" else f"/usr/bin/{tool}")
    monkeypatch.setattr(realnode, "CNI_BIN_DIRS", (tmp_path / "no-cni",))
    monkeypatch.setattr(binaries, "ensure", no_build)
    status = cli.main([*command, "--dir", str(tmp_path / "cluster")])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1, err
    assert "runc, the CNI plugins" in err and "apt-get install containernetworking-plugins runc" in err


def test_the_kubelet_is_a_node_identity_and_kube_proxy_the_proxier(state: controlplane.State) -> None:
    realnode.write_pki(state, address=ADDRESS)
    for name, common_name, groups in (
        ("kubelet-client", f"system:node:{realnode.NODE_NAME}", ["system:nodes"]),
        ("kube-proxy", "system:kube-proxy", []),
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []),
    ):
        certificate = x509.load_pem_x509_certificate((state.directory / "pki" / f"{name}.crt").read_bytes())
        assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == common_name
        assert [a.value for a in certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == groups


def test_the_apiserver_is_reachable_from_pods_and_authorizes_nodes_and_verifies_kubelets(state: controlplane.State) -> None:
    realnode.write_pki(state, address=ADDRESS)
    flags = realnode.apiserver_flags(state, address=ADDRESS)
    assert f"--advertise-address={ADDRESS}" in flags and "--bind-address=0.0.0.0" in flags
    assert "--endpoint-reconciler-type=lease" in flags, "the kubernetes Service needs an endpoint for in-cluster clients"
    assert "--authorization-mode=Node" in flags, "appended to the base --authorization-mode=RBAC"
    assert f"--kubelet-certificate-authority={state.directory / 'pki' / 'ca.crt'}" in flags
    serving = x509.load_pem_x509_certificate((state.directory / "pki" / "apiserver.crt").read_bytes())
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ADDRESS in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    assert "10.0.0.1" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]


def test_containerd_runs_on_its_own_socket_with_runc_the_local_pause_image_and_restricted_oom_adjustments(
    state: controlplane.State, cni_bin: Path
) -> None:
    realnode.write_configs(state, address=ADDRESS, cni_bin=cni_bin)
    config = tomllib.loads((realnode.node_dir(state) / "containerd.toml").read_text())
    assert config["grpc"]["address"] == str(realnode.socket_path(state))
    assert config["root"].startswith(str(state.directory)) and config["state"].startswith(str(state.directory))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["cni"]["bin_dir"] == str(cni_bin)
    assert cri["sandbox_image"] == realnode.PAUSE_IMAGE and cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2"
    conflist = json.loads(Path(cri["cni"]["conf_dir"], "10-gpu-admission.conflist").read_text())
    [bridge] = [p for p in conflist["plugins"] if p["type"] == "bridge"]
    assert bridge["bridge"] == realnode.BRIDGE and bridge["ipam"]["dataDir"].startswith(str(state.directory))
    assert len(str(realnode.socket_path(state))) < 108, "a unix socket path must fit sun_path"


def test_kube_proxy_listens_on_loopback_ports_of_its_own(state: controlplane.State, cni_bin: Path) -> None:
    realnode.write_configs(state, address=ADDRESS, cni_bin=cni_bin)
    config = json.loads((realnode.node_dir(state) / "kube-proxy.yaml").read_text())
    assert config["mode"] == "iptables" and config["hostnameOverride"] == realnode.NODE_NAME
    assert config["healthzBindAddress"].startswith("127.0.0.1:") and config["metricsBindAddress"].startswith("127.0.0.1:")
    kubeconfig = yaml.safe_load(Path(config["clientConnection"]["kubeconfig"]).read_text())
    assert kubeconfig["users"][0]["user"]["client-certificate"].endswith("kube-proxy.crt")


def test_teardown_finds_every_mount_below_the_node_directory_deepest_first(tmp_path: Path) -> None:
    root = tmp_path / "node"
    mountinfo = "\n".join(
        [
            f"36 35 0:30 / {root}/kubelet/pods/a/volumes/kubernetes.io~projected/token rw - tmpfs tmpfs rw",
            f"37 35 0:31 / {root}/containerd-state/io.containerd.runtime.v2.task/k8s.io/abc/rootfs rw - overlay overlay rw",
            f"38 35 0:32 / {root}-other/x rw - tmpfs tmpfs rw",
            "39 35 0:33 / /var/lib/docker/overlay2/x/merged rw - overlay overlay rw",
            f"40 35 0:34 / {root}/kubelet rw - tmpfs tmpfs rw",
            f"41 35 0:35 / {str(root).replace('/', '/', 1)}/with\\040space rw - tmpfs tmpfs rw",
        ]
    )
    found = realnode.mounts_under(root, mountinfo)
    assert f"{root}-other/x" not in found and "/var/lib/docker/overlay2/x/merged" not in found
    child = f"{root}/kubelet/pods/a/volumes/kubernetes.io~projected/token"
    assert found.index(child) < found.index(f"{root}/kubelet"), "a mount below another is unmounted first"
    assert f"{root}/with space" in found
    assert len(found) == 4


def test_cluster_status_tells_real_nodes_from_kwok_ones() -> None:
    listed = [
        ("gpu-a", {"kwok.x-k8s.io/node": "fake"}),
        (realnode.NODE_NAME, {"node.alpha.kubernetes.io/ttl": "0"}),
        ("other", {}),
    ]
    assert realnode.real_nodes(listed) == [realnode.NODE_NAME, "other"]


def test_extra_flags_reach_the_component_and_survive_a_reload(state: controlplane.State) -> None:
    state.extra_args = {"kube-apiserver": ["--bind-address=0.0.0.0"]}
    state.node_ip = ADDRESS
    state.save()
    loaded = controlplane.State.load(state.directory)
    assert loaded is not None and loaded.extra_args == state.extra_args and loaded.node_ip == ADDRESS


def test_the_test_overlay_changes_only_image_replicas_and_placement() -> None:
    from webhook.cluster import incluster

    built = incluster.overlay(base="../deploy")
    assert built["resources"] == ["../deploy"]
    assert built["images"] == [{"name": "gpu-admission", "newName": incluster.IMAGE_NAME, "newTag": incluster.IMAGE_TAG}]
    patched = [yaml.safe_load(p["patch"]) for p in built["patches"]]
    strategic = [p for p in patched if isinstance(p, dict)]
    assert {(p["kind"], p["metadata"]["name"]) for p in strategic} == set(incluster.WORKLOADS)
    for patch in strategic:
        assert set(patch["spec"]) <= {"replicas", "template"}
        assert patch["spec"]["template"] == {"spec": {"nodeSelector": {realnode.REAL_LABEL: "true"}}}
    replicas = {p["metadata"]["name"]: p["spec"].get("replicas") for p in strategic}
    assert replicas == {"gpu-admission-webhook": 2, "gpu-admission-extender": 1, "gpu-admission-labeler": None}
    appended = [p for p in patched if isinstance(p, list)]
    assert all(
        op[-1] == {"op": "add", "path": "/spec/template/spec/tolerations/-", "value": incluster.TOLERATION} for op in appended
    )


def test_kube_scheduler_calls_the_extender_service_ip_with_the_install_made_pair(tmp_path: Path) -> None:
    from webhook.cluster import incluster

    document = yaml.safe_load((incluster.deploy_dir() / "scheduler-config.yaml").read_text())
    changed = incluster.scheduler_configuration(document, cluster_ip="10.0.0.77", files=tmp_path)
    [extender] = changed["extenders"]
    assert extender["urlPrefix"] == "https://10.0.0.77:443" and extender["enableHTTPS"] is True
    assert extender["tlsConfig"]["serverName"] == document["extenders"][0]["tlsConfig"]["serverName"]
    assert extender["tlsConfig"]["certFile"] == str(tmp_path / "tls.crt") and extender["tlsConfig"]["caFile"] == str(
        tmp_path / "ca.crt"
    )
    assert {k: v for k, v in extender.items() if k not in {"urlPrefix", "tlsConfig"}} == {
        k: v for k, v in document["extenders"][0].items() if k not in {"urlPrefix", "tlsConfig"}
    }
