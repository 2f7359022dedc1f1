# vLLM 0.33.0 with kvscope installed beside it, for docker/compose.yaml's `vllm`
# profile and the engine container of docker/k8s/: vLLM's OffloadingConnector
# loads kvscope's spec from offload.vllm, and vLLM's own CUDA torch serves
# kvscope's worker side (kvscope asks for torch only through its `worker` extra).
#
#   docker build -f docker/vllm.Dockerfile -t kvscope-vllm:0.1.0 .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
FROM ${VLLM_IMAGE}
COPY pyproject.toml setup.py README.md /tmp/kvscope/
COPY offload /tmp/kvscope/offload
COPY app /tmp/kvscope/app
RUN python3 -m pip install --no-cache-dir /tmp/kvscope && rm -rf /tmp/kvscope
