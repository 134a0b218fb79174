# rec's image: training, export and the C++ server; docker-compose.yml runs each as a service.
# Two stages: `build` has the compilers, the -dev packages and the CMake tree; the runtime image
# gets the virtual environment, rec's sources and the rec-server binary, and runs as user `rec`.
# Works with the classic builder (docker-compose 1.29) and BuildKit alike.
#
#   docker build -t rec .                                  # CPU torch from PyTorch's CPU index
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#                --build-arg FBGEMM_PACKAGE=fbgemm-gpu -t rec:cuda .   # GPU hosts (never run here)
#   deploy/wheelhouse.sh && docker build -t rec .           # offline, from deploy/wheelhouse/
#   docker build --build-arg BASE=rec-base:bookworm -t rec . # a local base (deploy/build_base.sh)
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ENV DEBIAN_FRONTEND=noninteractive
# ninja-build: torch's extension builder compiles rec's op library's files in parallel with it
# (27 s instead of 44 on 2 cores).
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends build-essential cmake pkg-config \
       libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler nlohmann-json3-dev \
       zlib1g-dev libgtest-dev libhiredis-dev ninja-build \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/rec
# The Python stack first, with only what it reads, so that a source change does not reinstall it.
ARG PIP_SOURCE=auto
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG PYPI_INDEX=https://pypi.org/simple
ARG FBGEMM_PACKAGE=fbgemm-gpu-cpu
COPY requirements.txt ./
COPY deploy/install_stack.sh deploy/
COPY deploy/wheelhouse /wheelhouse
RUN PIP_SOURCE=$PIP_SOURCE TORCH_INDEX=$TORCH_INDEX PYPI_INDEX=$PYPI_INDEX \
    FBGEMM_PACKAGE=$FBGEMM_PACKAGE bash deploy/install_stack.sh
# rec-server next, from cpp/ alone, so that a change to the Python sources does not rebuild it;
# the op library it loads is rec/_ops.so, built by the editable install of rec below.
COPY cpp cpp
RUN cmake -S cpp -B build/cpp -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=.venv/bin/python \
       -DREC_OPS_LIBRARY=/opt/rec/rec/_ops.so \
       -DCMAKE_PREFIX_PATH="$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
       > /tmp/cmake.log || { cat /tmp/cmake.log; exit 1; } \
    && cmake --build build/cpp --target rec-server -j "$(nproc)"
COPY pyproject.toml setup.py README.md ./
COPY rec rec
COPY train train
COPY export export
COPY serve serve
# rec, editable as scripts/setup.sh installs it; this builds rec/_ops.so from cpp/ops.
RUN .venv/bin/pip install -q --disable-pip-version-check --no-cache-dir --no-deps \
       --no-build-isolation -e . \
    && test -f rec/_ops.so

FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
# rec-server's shared libraries from Debian (gRPC, protobuf, hiredis); LibTorch comes with the
# venv. redis-server: the embedding store's cluster nodes of compose's "tier" profile.
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends libgrpc++1.51 libprotobuf32 zlib1g \
       libhiredis0.14 redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home --home-dir /home/rec --shell /usr/sbin/nologin rec \
    && mkdir -p /runs /models /models-tier \
    && chown rec:rec /runs /models /models-tier
WORKDIR /opt/rec
COPY --from=build /opt/rec/.venv .venv
COPY --from=build /opt/rec/pyproject.toml /opt/rec/README.md ./
COPY --from=build /opt/rec/rec rec
COPY --from=build /opt/rec/train train
COPY --from=build /opt/rec/export export
COPY --from=build /opt/rec/serve serve
COPY --from=build /opt/rec/build/cpp/rec-server build/cpp/rec-server
ENV PATH=/opt/rec/.venv/bin:$PATH OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
# Named volumes mounted on /runs and /models start out owned by `rec`, as these directories are.
USER rec
EXPOSE 8000 8001 8002
# SIGTERM drains the server's accepted requests before it exits (stop_grace_period in compose).
STOPSIGNAL SIGTERM
CMD ["rec", "--help"]
