# Pharos in a container:
#   docker build -t pharos-router .          (podman build works the same)
#   docker run -p 8090:8090 -v pharos-state:/var/lib/pharos \
#       -v ./pharos.yaml:/etc/pharos/pharos.yaml:ro pharos-router
# It runs `twistd -n pharos -c /etc/pharos/pharos.yaml` as an unprivileged user (uid 10001);
# the config baked in is contrib/compose/pharos.yaml (Docker-label discovery, the state file
# under /var/lib/pharos). contrib/compose/compose.yaml runs it beside Ollama and vLLM.
# contrib/container/build-standin.sh builds and tries it where the base cannot be pulled.

# The wheel, built from this tree (.dockerignore keeps the virtualenv and tests out).
FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 pharos \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/pharos \
        --shell /usr/sbin/nologin pharos \
    && mkdir -p /var/lib/pharos /etc/pharos \
    && chown 10001:10001 /var/lib/pharos \
    && chmod 0700 /var/lib/pharos
COPY --from=wheel /wheels /wheels
# twistd finds the pharos plugin through Twisted's plugin cache: written now, as root, since
# the service user cannot write site-packages.
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && python -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
COPY contrib/compose/pharos.yaml /etc/pharos/pharos.yaml
USER 10001:10001
WORKDIR /var/lib/pharos
EXPOSE 8090
STOPSIGNAL SIGTERM
# 200 once the state is restored, 503 while starting and draining (spec section 9); the slim
# image has no curl, Python has urllib (an HTTP error status raises: exit 1).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8090/healthz', timeout=2)"]
# --pidfile= : no twistd.pid, which a restarted container (pid 1 again) would take for
# another twistd running.
CMD ["twistd", "-n", "--pidfile=", "pharos", "-c", "/etc/pharos/pharos.yaml"]
