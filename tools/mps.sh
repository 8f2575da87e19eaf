# MPS for the GPU scripts (gpu_run.sh, gpu_ab.sh): ranks sharing a GPU need it. Sourced;
# start_mps sets MPS_OWNED=1 when it started the daemon, stop_mps quits only that one.
MPS_OWNED=0
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "== WARNING: nvidia-cuda-mps-control not found; ranks sharing a GPU will time-slice"
    return 0
  fi
  if echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
    # Left over from an interrupted run: start afresh.
    echo "== MPS control daemon already running; restarting it"
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    sleep 2
  fi
  if nvidia-cuda-mps-control -d; then
    MPS_OWNED=1
    echo "== MPS started (pipe $CUDA_MPS_PIPE_DIRECTORY)"
  else
    echo "== WARNING: could not start MPS; ranks sharing a GPU will time-slice"
  fi
}
stop_mps() {
  if [ "$MPS_OWNED" = 1 ]; then
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    MPS_OWNED=0
    echo "== MPS stopped"
  fi
}
