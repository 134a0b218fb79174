# rec's own image: training, export and the C++ server (docker-compose.yml runs each as a service).
# Its RUN steps are the README's set-up, scripts/setup.sh: Debian packages, the pinned Python stack
# in /opt/rec/.venv, the `rec` CLI, and the CMake build of build/cpp/rec-server.
# Not built yet: no Docker engine on the development machines (docker-compose config validates
# the compose file only). torch==2.13.0 (CPU) comes from the package index the pip in this image
# is pointed at.
FROM python:3.11-slim-bookworm

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHON=python3
WORKDIR /opt/rec
# The set-up script first, with what it reads, so the layer with the Python stack and the C++
# build is rebuilt only when they change.
COPY scripts/setup.sh scripts/setup.sh
COPY requirements.txt pyproject.toml README.md ./
COPY cpp cpp
COPY rec rec
COPY train train
COPY export export
COPY serve serve
RUN bash scripts/setup.sh \
    && rm -rf /var/lib/apt/lists/* build/fuzz

ENV PATH=/opt/rec/.venv/bin:$PATH OMP_NUM_THREADS=1
EXPOSE 8000 8001 8002
# SIGTERM drains the server's accepted requests before it exits (stop_grace_period in compose).
STOPSIGNAL SIGTERM
CMD ["rec", "--help"]
