# One image for every component: `gpu-admission serve | extender | labeler | audit | ...`.
#
#   docker build -t gpu-admission:0.1.0 .
#
# BASE is any Debian-like image with python3 (>= 3.11) and its venv module; the default is the
# official Python image. Where no registry is reachable, make a base locally and name it, as the
# test cluster does (tests/e2e/image/build.sh: debootstrap, then `docker import`):
#
#   docker build --build-arg BASE=my-base:bookworm --network host \
#       --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t gpu-admission:0.1.0 .
#
# The optional `ca` secret is a CA bundle for pip (a proxy that re-signs TLS); BuildKit mounts it
# for the one RUN that installs, so it is in no layer and not in the image's history.
#
# The package is installed into a virtual environment in a build stage and only that environment
# is copied into the final image (no source tree, no pip cache, no pip). Trimmed, because nothing
# imports them: pip, setuptools and wheel; the kubernetes client's asyncio twin (kubernetes.aio,
# about 68 MB with its bytecode; the code uses the synchronous client only); test directories;
# the symbol tables of shared libraries (strip, where the build stage has or can install binutils).
# Bytecode is compiled at build time and kept: the root filesystem is read-only, so Python could
# not cache it at run time and would compile the kubernetes client's ~1,000 modules on every start.
# The generated kubernetes.client (API classes and models, about 30 MB of source) ships as bytecode
# only: a traceback through it shows no source lines, which nobody debugs here.
#
# It runs as the unprivileged user 65532 (numeric, so that Kubernetes' runAsNonRoot can verify it)
# and needs no writable path but /tmp, which the manifests mount as an emptyDir under a read-only
# root filesystem.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY certs/ certs/
COPY policies/ policies/
COPY webhook/ webhook/
RUN --mount=type=secret,id=ca,required=false \
    set -eu; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    python3 -m venv /opt/gpu-admission; \
    /opt/gpu-admission/bin/pip install --no-compile .; \
    /opt/gpu-admission/bin/pip uninstall --yes pip setuptools wheel >/dev/null 2>&1 || true; \
    site=$(/opt/gpu-admission/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    rm -rf "$site/kubernetes/aio" "$site"/*/tests "$site"/*/test; \
    find /opt/gpu-admission -name '__pycache__' -prune -exec rm -rf {} +; \
    /opt/gpu-admission/bin/python -m compileall -q -j 0 "$site" >/dev/null; \
    /opt/gpu-admission/bin/python -m compileall -q -j 0 -b "$site/kubernetes/client" >/dev/null; \
    find "$site/kubernetes/client" -name '__pycache__' -prune -exec rm -rf {} +; \
    find "$site/kubernetes/client" -name '*.py' -delete; \
    if command -v strip >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends binutils >/dev/null; }; then \
      find "$site" -name '*.so' -exec strip --strip-unneeded {} +; \
    fi; \
    /opt/gpu-admission/bin/gpu-admission --help >/dev/null; \
    /opt/gpu-admission/bin/python -c 'import kubernetes.client, cel_expr_python, cryptography.x509, aiohttp, pynvml'

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/gpu-admission/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN groupadd --system --gid 65532 gpu-admission \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpu-admission
COPY --from=build /opt/gpu-admission /opt/gpu-admission
USER 65532:65532
ENTRYPOINT ["/opt/gpu-admission/bin/gpu-admission"]
CMD ["--help"]
