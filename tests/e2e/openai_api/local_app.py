"""The app every module of this package calls: ``configs/tiny.yaml`` (two TT-mesh replicas with
the torch mesh model, one vLLM-CPU replica) with a small ingress concurrency bound; deployed once
for the package (``conftest.py``)."""

APP = "meshserve-e2e"
POOLS = {"tt": "TTMeshReplica-tt", "vllm": "VllmReplica-vllm"}
MAX_CONCURRENT = 6
PROMPT_IDS = [0, 17, 250, 33, 400, 5, 91]
