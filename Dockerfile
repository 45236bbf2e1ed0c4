# One image for every component: `gpu-admission serve | extender | labeler | audit | ...`.
#
#   docker build -t gpu-admission:0.1.0 .
#
# The package is installed with `pip install .` in a build stage and only the installed files are
# copied into the final image (no source tree, no pip cache). It runs as the unprivileged user
# 65532 (numeric, so that Kubernetes' runAsNonRoot can verify it) and needs no writable path but
# /tmp, which the manifests mount as an emptyDir under a read-only root filesystem.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY certs/ certs/
COPY policies/ policies/
COPY webhook/ webhook/
RUN pip install --no-cache-dir --root-user-action=ignore --prefix=/install .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 gpu-admission \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpu-admission
COPY --from=build /install /usr/local
USER 65532:65532
ENTRYPOINT ["gpu-admission"]
CMD ["--help"]
