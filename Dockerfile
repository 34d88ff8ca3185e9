# One image for both Cozystack operators; the Deployment's args pick which one runs:
#   python -m operators.gpuclass             (config/manager/gpuclass)
#   python -m operators.endpointattachment   (config/manager/endpointattachment)
#
# The builder installs the project and its runtime dependencies only, each at the version pinned in
# requirements.lock (used as constraints, so the dev tools of the lock are never installed), from
# wheels only, into a virtualenv made without pip: a throwaway pip elsewhere installs into it
# (pip --python), so the virtualenv carries no pip, setuptools or pkg_resources (checked below). The
# final stage copies that virtualenv onto a clean slim base: no compiler, no pip cache, no sources
# beyond the installed packages, a numeric non-root user, and nothing written at run time outside
# /tmp (the Deployment mounts an emptyDir there and sets readOnlyRootFilesystem).

# Any Python 3.11: hack/build-image.sh (make image) passes Debian bookworm bases it builds from
# Debian's packages, for machines that reach no image registry.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The builder's base: the same Python plus its venv module (the run-time base may lack it).
ARG BUILDER_IMAGE=${PYTHON_IMAGE}

FROM ${BUILDER_IMAGE} AS builder
# A CA bundle for pip, mounted by the build (never copied): networks that re-sign TLS need it.
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml requirements.lock README.md ./
COPY shared ./shared
COPY operators ./operators
# Byte-code is compiled at install time (pip's default), so the read-only image never needs to write it.
RUN python -m venv --without-pip /opt/venv \
    && python -m venv /tmp/pip \
    && /tmp/pip/bin/pip --python /opt/venv/bin/python install --no-cache-dir --only-binary=:all: \
       -c requirements.lock . \
    && /opt/venv/bin/python -c "import importlib.util as u, sys; \
sys.exit(any(u.find_spec(m) for m in ('pip', 'setuptools', 'pkg_resources')))" \
    && /opt/venv/bin/python -c "import operators.gpuclass.__main__, operators.endpointattachment.__main__"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="cozystack-operators" \
      org.opencontainers.image.description="GPUClass and EndpointAttachment operators for Cozystack"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=builder /opt/venv /opt/venv
# The working directory is on sys.path under `python -m`: keep it the root, which nobody can write.
WORKDIR /
USER 65532:65532
# Metrics (Prometheus) and the liveness endpoint.
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m"]
CMD ["operators.gpuclass"]
