#!/usr/bin/env bash
# Run the cross-engine conformance suite against a GPU engine in NVIDIA's Triton image.
#
#   docker/run_gpu_tests.sh                # TensorRT-LLM: tensorrt_llm_model
#   ENGINE=vllm docker/run_gpu_tests.sh    # vLLM on GPU:  vllm_model (the image serves vllm_model_gpu's settings under that name)
#   TRITON_VERSION=25.10 docker/run_gpu_tests.sh
#
# On the host it builds docker/Dockerfile.$ENGINE and reruns itself inside the
# container (--inside), where it prepares the model, starts tritonserver on the model,
# waits until it is ready and runs tests/e2e/test_conformance.py attached to that
# server (TRITONFORGE_TEST_ATTACH) — the same tests that run on CPU for vLLM and
# llama.cpp. Needs docker with the NVIDIA container toolkit and one CUDA GPU.
set -euo pipefail

ENGINE=${ENGINE:-trtllm}
case "$ENGINE" in
    trtllm) MODEL=tensorrt_llm_model ;;
    vllm) MODEL=vllm_model ;;
    *) echo "ENGINE must be trtllm or vllm, got $ENGINE" >&2; exit 2 ;;
esac

if [[ "${1:-}" != "--inside" ]]; then
    cd "$(dirname "$0")/.."
    image="tritonforge-$ENGINE:test"
    docker build -f "docker/Dockerfile.$ENGINE" \
        --build-arg "TRITON_VERSION=${TRITON_VERSION:-25.10}" -t "$image" .
    exec docker run --rm --gpus all --shm-size=2g \
        --ulimit memlock=-1 --ulimit stack=67108864 \
        -e "ENGINE=$ENGINE" -v tritonforge-models:/opt/tritonforge/models \
        "$image" bash docker/run_gpu_tests.sh --inside "${@}"
fi
shift

cd /opt/tritonforge
python3 -m tritonforge.launch.model_store  # converts the GGUF once into the mounted volume
log=$(mktemp --suffix=.tritonserver.log)
tritonserver --model-repository=/opt/tritonforge/model_repository \
    --model-control-mode=explicit --load-model="$MODEL" \
    --http-port=8000 --grpc-port=8001 --metrics-port=8002 >"$log" 2>&1 &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT

for _ in $(seq 1 600); do
    if curl -sf localhost:8000/v2/models/"$MODEL"/ready >/dev/null; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then
        echo "tritonserver exited before $MODEL was ready:" >&2
        tail -n 80 "$log" >&2
        exit 1
    fi
    sleep 1
done
curl -sf localhost:8000/v2/models/"$MODEL"/ready >/dev/null \
    || { echo "$MODEL not ready after 600 s" >&2; tail -n 80 "$log" >&2; exit 1; }

TRITONFORGE_TEST_ATTACH=8000,8001,8002 python3 -m pytest -p no:cacheprovider -ra \
    tests/e2e/test_conformance.py -k "$MODEL" "$@"
