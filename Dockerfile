# inferplane image: both programs (mayu, inferplaned) installed from the project's wheel.
#
#   scripts/image                       # docker, podman or buildah, whichever runs here
#   docker build -t ghcr.io/inferplane/inferplane:0.1.0 .
#
# Runs as an unprivileged user (uid 10001) and works with a read-only root filesystem:
# nothing is written outside the two volumes, /var/lib/mayu (data_dir: audit files,
# journal, SQLite in the local profile) and /tmp (TMPDIR). Migrations ship inside the
# wheel, so `mayu migrate` needs no checkout (the chart's migration Job runs it).

ARG PYTHON_VERSION=3.11

# -- build: the project's wheel and every dependency as wheels -------------------------
FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY gateway gateway
COPY controlplane controlplane
COPY sql sql
COPY migrations migrations
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

# -- run: install from those wheels only -----------------------------------------------
FROM python:${PYTHON_VERSION}-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    HOME=/var/lib/mayu
COPY --from=build /wheels /wheels
# --compile: bytecode is written now, since the root filesystem is read-only at run time.
RUN python -m pip install --no-cache-dir --no-index --find-links /wheels --compile \
        inferplane \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 inferplane \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/mayu --no-create-home \
        --shell /usr/sbin/nologin inferplane \
    && mkdir -p /var/lib/mayu /etc/mayu \
    && chown 10001:10001 /var/lib/mayu
USER 10001:10001
WORKDIR /var/lib/mayu
VOLUME ["/var/lib/mayu", "/tmp"]
EXPOSE 4000 8470
# The gateway by default; `inferplaned serve --config ...` and `mayu migrate` use the
# same image (the chart sets the command per workload, and its probes: /healthz, /readyz).
CMD ["mayu", "serve", "--config", "/etc/mayu/mayu.yaml", "--host", "0.0.0.0"]
