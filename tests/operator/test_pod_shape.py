"""The serving pod's shape as the operator builds it (pure, no cluster): the sidecar's B
equals vLLM's, the model's source and served name, the admin port kept out of the Service
and Ingress, and the NetworkPolicy."""

from __future__ import annotations

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


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_sidecar_max_running_is_vllms_max_num_seqs_default_and_user_set() -> None:
    """One function (policy_batch.batch_shape) gives both containers B: 256 by default (vLLM
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
    assert _flag(vllm["args"], "--model") == "/models/llama"
    assert _flag(vllm["args"], "--served-model-name") == "llama-3-8b"
    assert _flag(vllm["args"], "--tensor-parallel-size") == "4"
    plain = template(spec(model={"name": "Qwen/Qwen3-8B"}))["spec"]["containers"][0]
    assert _flag(plain["args"], "--model") == _flag(plain["args"], "--served-model-name")
    assert plain["image"] == "vllm/vllm-openai:v0.32.0"


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
    open_rule, watched = network["ingress"]
    assert open_rule == {"ports": [{"protocol": "TCP", "port": "http"}]}
    assert {p["port"] for p in watched["ports"]} == {c.ADMIN_PORT_NAME, "vllm"}
    assert [f["namespaceSelector"]["matchLabels"] for f in watched["from"]] == [
        {c.NAMESPACE_NAME_LABEL: "monitoring"}
    ]
    with_operator = b.OperatorSettings(operator_namespace="jitserve-system")
    assert b.watcher_namespaces(with_operator) == ["monitoring", "jitserve-system"]
    froms = b.build_network_policy(REF, ["a", "b"])["spec"]["ingress"][1]["from"]
    assert [f["namespaceSelector"]["matchLabels"][c.NAMESPACE_NAME_LABEL] for f in froms] == [
        "a", "b"]
