# sdxl-jax web app. ACCELERATOR (build argument) picks what JAX runs on:
#   docker build -t sdxl-jax .                                # auto (default): TPU and NVIDIA GPU support both
#                                                             # installed; JAX uses whichever the host has
#   docker build -t sdxl-jax:tpu  --build-arg ACCELERATOR=tpu .      # TPU VM only (v5e/v6e): smaller image
#   docker build -t sdxl-jax:cuda --build-arg ACCELERATOR=cuda12 .   # NVIDIA GPU only: CUDA as wheels
#   docker build -t sdxl-jax:cpu  --build-arg ACCELERATOR=cpu .      # CPU only (slow; for trying it out)
# Run (TPU): docker run --privileged --net=host -v sdxl-data:/data sdxl-jax
# Run (GPU): docker run --gpus all -p 7860:7860 -v sdxl-data:/data sdxl-jax:cuda
# Multi-host TPU slice: the same image on every worker with -e SDXL_DISTRIBUTED=1 (see docs/deploy.md, "Several hosts").
# Model weights (HF_HOME), compiled XLA programs (JAX_COMPILATION_CACHE_DIR) and past generations (SDXL_DATA_DIR)
# live on the /data volume, so a restarted container neither downloads nor compiles again and keeps its history.
FROM python:3.11-slim

ARG ACCELERATOR=auto
ARG JAX_VERSION=0.10.2

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Non-root user with UID 1000 (what Hugging Face Spaces expects); /data is the cache volume.
RUN useradd --create-home --uid 1000 --shell /bin/bash user \
    && mkdir -p /data/hf /data/jax-cache /data/sdxl-jax /data/history \
    && chown -R user:user /data

WORKDIR /app

# Dependencies first, in their own layers, so editing the code does not reinstall them.
COPY requirements.txt .
RUN pip install -r requirements.txt
RUN case "$ACCELERATOR" in \
      auto)   pip install "jax[tpu,cuda12]==${JAX_VERSION}" ;; \
      tpu)    pip install "jax[tpu]==${JAX_VERSION}" ;; \
      cuda12) pip install "jax[cuda12]==${JAX_VERSION}" ;; \
      cpu)    echo "CPU image: using jax from requirements.txt" ;; \
      *)      echo "ACCELERATOR must be auto, tpu, cuda12 or cpu; got '$ACCELERATOR'" >&2; exit 1 ;; \
    esac

COPY --chown=user:user pipeline/ pipeline/
COPY --chown=user:user web/ web/
COPY --chown=user:user assets/ assets/
COPY --chown=user:user app.py .

USER user

ENV HOME=/home/user \
    HF_HOME=/data/hf \
    SDXL_JAX_CACHE=/data/sdxl-jax \
    JAX_COMPILATION_CACHE_DIR=/data/jax-cache \
    SDXL_DATA_DIR=/data/history \
    GRADIO_TEMP_DIR=/tmp/gradio \
    GRADIO_ANALYTICS_ENABLED=False \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    SDXL_MODEL=stabilityai/stable-diffusion-xl-base-1.0

VOLUME ["/data"]
EXPOSE 7860

CMD ["python", "app.py"]
