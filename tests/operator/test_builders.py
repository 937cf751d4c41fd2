"""Pure builders: spec -> child objects, no cluster."""

from __future__ import annotations

import json
import subprocess

import yaml

from jitserve.devstack import vllm as vl
from jitserve.operator import analyzer_builders as ab
from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.policy import SLOPolicySpec, load_policy
from tests.support.kube_fake import serving

REF = b.PolicyRef(name="chat", namespace="team-a", uid="1234")
SETTINGS = b.OperatorSettings()


def spec(**wire: object) -> SLOPolicySpec:
    return load_policy(serving(dict(wire)))


def template(s: SLOPolicySpec) -> dict[str, object]:
    return b.build_deployment(REF, s, SETTINGS)["spec"]["template"]


def test_scheduler_fairness_slo_and_tenant_changes_leave_the_pod_template_alone() -> None:
    base = spec()
    tuned = spec(
        scheduler={"cutoff": {"mode": "fixed", "value": 0.5}, "frameSteps": 10},
        fairness={"weight": 0.7, "tenants": [{"name": "a", "weight": 3, "apiKeySecret": "key-a"}]},
        sloDefaults={"latency": {"ttftSeconds": 1.0, "tbtSeconds": 0.05}, "deadlineSeconds": 5},
        admission={"overloadAction": "demote", "queueCap": 10},
        objective="requests",
    )
    assert template(tuned) == template(base)
    old_cm = b.build_config_map(REF, base)["data"][c.CONFIG_KEY]
    new_cm = b.build_config_map(REF, tuned)["data"][c.CONFIG_KEY]
    assert old_cm != new_cm
    assert yaml.safe_load(new_cm)["scheduler"]["cutoff"]["value"] == 0.5
    assert yaml.safe_load(new_cm)["fairness"]["weight"] == 0.7
    # The config file is exactly what the sidecar loads.
    assert load_policy(yaml.safe_load(new_cm)) == tuned


def test_model_image_and_resource_changes_roll_the_pods() -> None:
    base = template(spec())
    for change in (
        {"model": {"name": "meta-llama/Llama-3-8B"}},
        {"model": {"image": "vllm/vllm-openai:v0.12.0"}},
        {"model": {"cpu": "8"}},
        {"model": {"memory": "64Gi"}},
        {"model": {"gpus": 2}},
        {"model": {"args": ["--max-model-len", "4096"]}},
    ):
        assert template(spec(**change)) != base, change


def test_pod_runs_vllm_and_sidecar_non_root_with_probes_and_resources() -> None:
    s = spec(model={"gpus": 2, "cpu": "8", "memory": "64Gi", "args": ["--dtype", "bfloat16"]})
    pod = template(s)["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    vllm, sidecar = pod["containers"]
    assert [vllm["name"], sidecar["name"]] == ["vllm", "sidecar"]
    for container in (vllm, sidecar):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "livenessProbe" in container
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert vllm["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    assert vllm["args"][-4:] == ["--dtype", "bfloat16", "--max-num-seqs", "256"]
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == "2"  # = gpus
    assert "startupProbe" in vllm and sidecar["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "--config" in sidecar["args"]
    assert f"{c.CONFIG_DIR}/{c.CONFIG_KEY}" in sidecar["args"]
    # The config is mounted as a directory (subPath mounts never see updates).
    mount = sidecar["volumeMounts"][0]
    assert mount["mountPath"] == c.CONFIG_DIR and "subPath" not in mount
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == b.config_map_name("chat")


def test_no_gpu_limit_when_gpus_is_zero() -> None:
    vllm = template(spec(model={"gpus": 0}))["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in vllm["resources"]["limits"]


def test_children_carry_owner_references_labels_and_selectors() -> None:
    s = spec(ingress={"host": "chat.example.com", "className": "nginx", "tlsSecret": "chat-tls"})
    children = b.build_policy_children(REF, s, SETTINGS)
    assert [o["kind"] for o in children] == [
        "ConfigMap",
        "Secret",
        "Service",
        "NetworkPolicy",
        "Deployment",
        "Ingress",
    ]
    for obj in children:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": "chat",
            "uid": "1234",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert obj["metadata"]["labels"][c.LABEL_POLICY] == "chat"
        assert obj["metadata"]["namespace"] == "team-a"
    deployment, service, network = children[4], children[2], children[3]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["selector"] == selector
    assert network["spec"]["podSelector"]["matchLabels"] == selector
    ingress = children[5]["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["tls"] == [{"hosts": ["chat.example.com"], "secretName": "chat-tls"}]
    assert ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "chat"


def test_no_ingress_without_an_ingress_section() -> None:
    assert b.build_ingress(REF, spec()) is None


def test_the_url_is_where_requests_enter() -> None:
    from jitserve.operator.routing import policy_url

    assert policy_url(REF, spec()) == "http://chat.team-a.svc.cluster.local"
    assert policy_url(REF, spec(replicas=3)) == "http://chat-gateway.team-a.svc.cluster.local"
    tls = spec(ingress={"host": "chat.example.com", "path": "/v1/", "tlsSecret": "chat-tls"})
    assert policy_url(REF, tls) == "https://chat.example.com/v1"
    assert policy_url(REF, spec(ingress={"host": "chat.example.com"})) == "http://chat.example.com"


def test_analyzer_is_owned_by_every_policy_and_controlled_by_none() -> None:
    owners = [b.PolicyRef("b", "ns", "u2"), b.PolicyRef("a", "ns", "u1")]
    objs = ab.build_analyzer_children("ns", owners, SETTINGS)
    assert [o["kind"] for o in objs] == ["PersistentVolumeClaim", "Service", "Deployment"]
    for obj in objs:
        refs = obj["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs] == ["u1", "u2"]
        assert not any(r.get("controller") for r in refs)
    pod = objs[2]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == c.ANALYZER_NAME
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_sidecar_points_at_the_namespace_analyzer() -> None:
    sidecar = template(spec())["spec"]["containers"][1]
    assert b.analyzer_address("team-a") in sidecar["args"]


def test_long_or_dotted_policy_names_are_reported() -> None:
    assert b.name_problems("chat") == []
    assert "metadata.name" in b.name_problems("x" * 60)[0]
    assert "metadata.name" in b.name_problems("a.b")[0]


def test_tenant_keys_live_in_one_secret_mounted_at_a_fixed_path() -> None:
    secret = b.build_api_keys_secret(REF, {"key-b": "Yg==", "key-a": "YQ=="})
    assert secret["metadata"]["name"] == "chat-api-keys"
    assert secret["data"] == {"key-a": "YQ==", "key-b": "Yg=="}
    pod = template(spec())["spec"]
    sidecar = pod["containers"][1]
    assert sidecar["args"][sidecar["args"].index("--keys-dir") + 1] == c.KEYS_DIR
    volume = next(v for v in pod["volumes"] if v["name"] == "api-keys")
    assert volume["secret"] == {"secretName": "chat-api-keys", "optional": True}


# ---- the serving pod's shape: B equals vLLM's, model source and served name, the admin
# port kept out of the Service and Ingress, the NetworkPolicy
def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_sidecar_max_running_is_vllms_max_num_seqs_default_and_user_set() -> None:
    """One function (jitserve.policy.batch_shape) gives both containers B: 256 by default (vLLM
    picks more on large GPUs, so it is always passed), the user's --max-num-seqs if set."""
    for s, b_slots in ((spec(), "256"), (spec(model={"args": ["--max-num-seqs=48"]}), "48")):
        vllm, sidecar = template(s)["spec"]["containers"]
        assert vllm["args"].count("--max-num-seqs=48") + vllm["args"].count("--max-num-seqs") == 1
        given = [a.split("=", 1)[1] for a in vllm["args"] if a.startswith("--max-num-seqs=")]
        assert (given[0] if given else _flag(vllm["args"], "--max-num-seqs")) == b_slots
        assert _flag(sidecar["args"], "--max-running") == b_slots
        assert _flag(sidecar["args"], "--engine-queue") == str(int(b_slots) // 2)
    queued = spec(sidecar={"engineQueue": 0})
    assert _flag(template(queued)["spec"]["containers"][1]["args"], "--engine-queue") == "0"


def test_model_source_is_loaded_and_name_is_served() -> None:
    s = spec(model={"name": "llama-3-8b", "source": "/models/llama", "gpus": 4})
    vllm = template(s)["spec"]["containers"][0]
    assert vllm["command"] == ["vllm", "serve"] and vllm["args"][0] == "/models/llama"
    assert _flag(vllm["args"], "--served-model-name") == "llama-3-8b"
    assert _flag(vllm["args"], "--tensor-parallel-size") == "4"
    plain = template(spec(model={"name": "Qwen/Qwen3-8B"}))["spec"]["containers"][0]
    assert plain["args"][0] == _flag(plain["args"], "--served-model-name")
    assert plain["image"] == "vllm/vllm-openai:v0.32.0"


VLLM_PARSES = """
import json, sys
from vllm.entrypoints.cli.serve import FlexibleArgumentParser, ServeSubcommand
parser = FlexibleArgumentParser()
ServeSubcommand().subparser_init(parser.add_subparsers(dest="cmd"))
args = parser.parse_args(["serve", *json.loads(sys.argv[1])])
print(json.dumps([args.model_tag, args.served_model_name, args.max_num_seqs,
                  args.scheduling_policy, args.tensor_parallel_size]))
"""


def test_the_pods_command_line_is_one_vllm_serve_accepts() -> None:
    """vLLM's own `vllm serve` parser (the tested vLLM, from scripts/setup-vllm.sh) reads
    the pod's arguments as meant: the model positional, B, priority scheduling."""
    python = vl.vllm_python()
    assert python is not None, "vLLM is not installed: run scripts/setup-vllm.sh"
    vllm = template(spec(model={"name": "llama-3-8b", "source": "/models/llama", "gpus": 2,
                                "args": ["--max-model-len", "4096"]}))["spec"]["containers"][0]
    assert vllm["command"] == ["vllm", "serve"]
    out = subprocess.run([str(python), "-c", VLLM_PARSES, json.dumps(vllm["args"])],
                         capture_output=True, text=True, timeout=300, check=True)
    model, served, seqs, policy, tp = json.loads(out.stdout.strip().splitlines()[-1])
    assert (model, served, seqs, policy, tp) == ("/models/llama", ["llama-3-8b"], 256,
                                                 "priority", 2)


def test_admin_port_in_the_pod_not_in_the_service_or_ingress() -> None:
    s = spec(ingress={"host": "chat.example.com"})
    children = {o["kind"]: o for o in b.build_policy_children(REF, s, SETTINGS)}
    sidecar = children["Deployment"]["spec"]["template"]["spec"]["containers"][1]
    assert _flag(sidecar["args"], "--admin-port") == str(s.sidecar.admin_port)
    assert {p["name"] for p in sidecar["ports"]} == {"http", c.ADMIN_PORT_NAME}
    assert [p["targetPort"] for p in children["Service"]["spec"]["ports"]] == ["http"]
    paths = children["Ingress"]["spec"]["rules"][0]["http"]["paths"]
    assert [p["backend"]["service"]["port"] for p in paths] == [{"name": "http"}]
    network = children["NetworkPolicy"]["spec"]
    open_rule, placers, watched = network["ingress"]
    assert open_rule == {"ports": [{"protocol": "TCP", "port": "http"}]}
    # the policy's own gateway and endpoint picker read the replica report on the admin port
    assert placers["ports"] == [{"protocol": "TCP", "port": c.ADMIN_PORT_NAME}]
    assert placers["from"] == [{"podSelector": {"matchExpressions": [
        {"key": c.LABEL_POLICY, "operator": "In", "values": ["chat"]},
        {"key": c.LABEL_COMPONENT, "operator": "In", "values": ["gateway", "picker"]}]}}]
    assert {p["port"] for p in watched["ports"]} == {c.ADMIN_PORT_NAME, "vllm"}
    assert [f["namespaceSelector"]["matchLabels"] for f in watched["from"]] == [
        {c.NAMESPACE_NAME_LABEL: "monitoring"}
    ]
    with_operator = b.OperatorSettings(operator_namespace="jitserve-system")
    assert b.watcher_namespaces(with_operator) == ["monitoring", "jitserve-system"]
    froms = b.build_network_policy(REF, ["a", "b"])["spec"]["ingress"][2]["from"]
    assert [f["namespaceSelector"]["matchLabels"][c.NAMESPACE_NAME_LABEL] for f in froms] == [
        "a", "b"]


def test_the_sidecar_names_its_policy_in_its_build_info() -> None:
    sidecar = next(c for c in template(spec())["spec"]["containers"]  # type: ignore[index]
                   if c["name"] == "sidecar")
    i = sidecar["args"].index("--policy-name")
    assert sidecar["args"][i + 1] == REF.name
